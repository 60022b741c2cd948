"""A run's progress as ``ingest run`` shows it: live on a terminal, a log line every interval off one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ingest.progress import Figures, clock, counted

#: the logger of progress lines (shown unless ``-q``, whatever ``-v`` says)
log = logging.getLogger("ingest.progress")


def render(figures: Figures, table: str) -> RenderableType:
    """The live display of a catch-up: what is done of it, how fast, what is left, and the batch in flight."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(width=30)
    grid.add_column(no_wrap=True)
    done = figures.records + figures.batch_done
    total = figures.records + figures.lag_total if figures.lag_total is not None else None
    eta = f"ETA {clock(figures.eta_s)}" if figures.lag is not None else ""
    grid.add_row(
        Text(f"{figures.pipeline} → {table}", style="bold"),
        ProgressBar(total=max(total, done, 1) if total is not None else None, completed=done),
        f"{done:,}" + (f" of {total:,}" if total is not None else "") + " records · "
        f"{(figures.bytes + figures.batch_bytes) / 1e6:,.1f} MB · {figures.rate:,.0f} records/s · "
        f"{clock(figures.elapsed_s)} {eta}",
    )
    if figures.batch is not None:
        grid.add_row(
            Text(f"  batch {figures.batch}"),
            ProgressBar(total=max(figures.batch_planned, 1), completed=figures.batch_done),
            f"{figures.batch_done:,} of {figures.batch_planned:,} read · {counted(figures.chunks, 'chunk')} decoded · "
            f"{counted(figures.files, 'file')} written",
        )
    rows: list[RenderableType] = [grid]
    if figures.lag is not None and len(figures.lag) > 1:
        left = " · ".join(f"{escape(topic)} {n:,}" for topic, n in sorted(figures.lag.items()))
        rows.append(Text.from_markup(f"  lag left: {left}"))
    elif figures.lag is not None:
        rows.append(Text(f"  lag left: {figures.lag_total:,}"))
    return Group(*rows)


@contextlib.contextmanager
def live(console: Console, figures: Callable[[], Figures], table: str) -> Iterator[None]:
    """The live display of ``figures()`` on ``console`` (a terminal) while the block runs; what
    the block prints to stdout appears above it."""
    with Live(get_renderable=lambda: render(figures(), table), console=console, refresh_per_second=4, transient=True):
        yield


def line(figures: Figures) -> None:
    """A progress line in the log (``--log-format json``: the figures as fields of ``progress``)."""
    log.info("%s", figures.text(), extra={"progress": figures.as_dict()})
