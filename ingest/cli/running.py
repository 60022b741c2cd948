"""``ingest run``: a config's tables driven by :mod:`ingest.driver`, shown as they go."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.markup import escape

from ingest.cli import live
from ingest.cli.common import (
    ConfigOption,
    EngineName,
    EngineOption,
    JsonOption,
    LogFormat,
    LogFormatOption,
    TableOption,
    VerboseOption,
    app,
    err,
    guarded,
    out,
    parse_duration,
    routes_of,
)
from ingest.config import PipelineConfig

#: ``ingest run``'s exit code after SIGTERM stopped it between batches (128 + SIGTERM, as a shell reports it)
STOPPED_EXIT = 143


@app.command()
def run(
    config: ConfigOption,
    table: TableOption = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
    until_caught_up: Annotated[
        bool,
        typer.Option("--until-caught-up", help="Run batches until the end offsets seen at start are in."),
    ] = False,
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            metavar="DURATION",
            help="Keep running: one catch-up every DURATION, such as 30s, 5m or 1h (a bare number is seconds).",
        ),
    ] = None,
    max_batches: Annotated[int | None, typer.Option("--max-batches", min=1, help="Stop after N batches.")] = None,
    engine: EngineOption = EngineName.local,
    json_output: JsonOption = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress: neither the live display nor progress log lines.")
    ] = False,
    progress_every: Annotated[
        str,
        typer.Option(
            "--progress-every",
            metavar="DURATION",
            help="Off a terminal: a progress log line (and the metrics' export) this often while batches run.",
        ),
    ] = "30s",
) -> None:
    """Commit micro-batches (default: one batch). Safe to retry and to run concurrently."""
    if until_caught_up and every:
        raise typer.BadParameter("use either --until-caught-up or --every")
    interval = parse_duration(every) if every else None
    if interval is not None and interval < 1:
        raise typer.BadParameter(f"--every {every} would run without pause; give at least 1s", param_hint="--every")
    report_every = parse_duration(progress_every)
    if report_every <= 0:
        raise typer.BadParameter(f"{progress_every} is no interval", param_hint="--progress-every")
    if not quiet:  # progress lines whatever -v says (a run off a terminal shows no other sign of life)
        logging.getLogger("ingest.progress").setLevel(logging.INFO)
    stop = threading.Event()  # SIGTERM (Airflow killing the task, a pod stopping): finish the batch in flight

    def body() -> None:
        from ingest.driver import Schedule, drive

        schedule = Schedule(until_caught_up, max_batches, interval)
        routes = routes_of(config, table)
        shown = _Shown(
            json_output, several=len(routes) > 1, catch_up=schedule.catches_up, every=interval is not None, quiet=quiet
        )
        drive(routes, shown, schedule, engine.value, stop, report_every)  # type: ignore[arg-type]
        if stop.is_set():
            err.print(
                "stopped by SIGTERM between batches: every batch that began was committed or left no trace; "
                f"run again to continue (exit {STOPPED_EXIT})",
                highlight=False,
            )
            raise typer.Exit(STOPPED_EXIT)

    if threading.current_thread() is not threading.main_thread():  # called as a function (a test, a thread)
        guarded(json_output, body)
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        guarded(json_output, body)
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Shown:
    """What ``ingest run`` shows of its batches (a :class:`ingest.driver.Watcher`): a line each (or
    ``--json``), its progress (live on a terminal, else a log line every ``--progress-every``),
    and the failures it rides out."""

    def __init__(self, json_output: bool, *, several: bool, catch_up: bool, every: bool, quiet: bool) -> None:
        self.json_output, self.several, self.catch_up, self.every = json_output, several, catch_up, every
        self.live = not quiet and not json_output and err.is_terminal
        self.lines = not quiet and not self.live
        self._heading: str | None = None

    @contextlib.contextmanager
    def tick(self, run: Any) -> Iterator[None]:
        config = run.pipeline.config
        # several tables: each one's name above its batches' lines (none for an idle tick of `--every`)
        self._heading = config.table if self.several and not self.json_output else None
        if not self.live:
            yield
            return
        with live.live(err, run.progress.figures, config.table):
            yield

    def batch(self, run: Any, result: Any) -> None:
        from ingest import render

        if result.status == "empty" and self.every and not self.json_output:
            return  # an idle tick of `--every`: nothing to say (`--json` still says it, one line a tick)
        if self._heading is not None:
            out.print(f"[bold]{self._heading}[/]", highlight=False)
            self._heading = None
        if self.json_output:
            print(json.dumps({**result.as_dict(), "table": run.pipeline.config.table}), flush=True)
        else:
            render.batch(result, out)

    def progress(self, run: Any, figures: Any) -> None:
        if self.lines:
            live.line(figures)

    def failed(self, config: PipelineConfig, error: Exception) -> None:
        kind = "retryable" if getattr(error, "retryable", False) else "fatal"
        err.print(f"[red]{config.table}[/] ({kind}, {type(error).__name__}): {escape(str(error))}")

    def retrying(self, why: str, every_s: float) -> None:
        err.print(f"[yellow]retryable[/] {escape(why)}; next try in {every_s:.0f}s")
