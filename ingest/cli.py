"""The ``ingest`` command line: rich output for people, ``--json`` for machines.

Exit codes (see :class:`ingest.errors.ExitCode`): 0 success, 75 retryable failure, 65 fatal
failure (data loss, ledger lost, verification failed), 78 configuration error, 1 internal error.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ingest import config as config_module
from ingest.errors import ConfigError, ExitCode, IngestError, VerificationFailed

app = typer.Typer(
    name="ingest",
    help="Exactly-once Kafka to Apache Iceberg micro-batches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)
log = logging.getLogger("ingest")

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="Pipeline YAML file.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
T = TypeVar("T")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """``300``, ``30s``, ``5m``, ``1h`` or ``250ms`` as seconds."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration; use e.g. 30s, 5m or 1h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def _guarded(json_output: bool, action: Callable[[], T]) -> T:
    """Run a command body; map domain errors to their exit codes with a message that says why."""
    try:
        return action()
    except IngestError as error:
        kind = "retryable" if error.retryable else ("config" if isinstance(error, ConfigError) else "fatal")
        if json_output:
            print(json.dumps({"error": str(error), "kind": kind, "type": type(error).__name__}))
        err.print(f"[bold red]error[/] ({kind}, {type(error).__name__}): {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(int(error.exit_code)) from None


def _open(path: Path) -> Any:
    from ingest.pipeline import Pipeline

    return Pipeline.open(config_module.load(path))


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def run(
    config: ConfigOption,
    until_caught_up: Annotated[
        bool,
        typer.Option("--until-caught-up", help="Run batches until the end offsets seen at start are in."),
    ] = False,
    every: Annotated[
        str | None, typer.Option("--every", help="Keep running: one catch-up every DURATION (e.g. 5m).")
    ] = None,
    max_batches: Annotated[int | None, typer.Option("--max-batches", min=1, help="Stop after N batches.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Commit micro-batches (default: one batch). Safe to retry and to run concurrently."""
    if until_caught_up and every:
        raise typer.BadParameter("use either --until-caught-up or --every")
    interval = parse_duration(every) if every else None

    def body() -> None:
        pipeline = _open(config)
        while True:
            started = time.monotonic()
            _run_once(pipeline, until_caught_up or interval is not None, max_batches, json_output)
            if interval is None:
                return
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    _guarded(json_output, body)


def _run_once(pipeline: Any, catch_up: bool, max_batches: int | None, json_output: bool) -> None:
    show_progress = catch_up and not json_output and err.is_terminal
    total = sum(p["lag"] for p in _status(pipeline)["partitions"]) if show_progress else 0
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not show_progress,
        transient=True,
    ) as progress:
        task = progress.add_task(f"catching up {pipeline.config.pipeline}", total=total or None)
        for result in pipeline.run(until_caught_up=catch_up, max_batches=max_batches):
            progress.advance(task, result.records + result.dead_letters)
            if json_output:
                print(json.dumps(result.as_dict()), flush=True)
            else:
                out.print(
                    f"batch {result.batch}: [bold]{result.status}[/] {result.records} rows, "
                    f"{result.dead_letters} dead letters, {result.bytes / 1e6:.1f} MB in {result.seconds:.2f}s"
                    + (f" (snapshot {result.snapshot_id})" if result.snapshot_id else ""),
                    highlight=False,
                )


def _status(pipeline: Any) -> dict[str, Any]:
    from ingest import report

    return report.status(pipeline)


@app.command()
def status(config: ConfigOption, json_output: JsonOption = False) -> None:
    """Per partition: the committed offset, the end offset, and the lag."""

    def body() -> None:
        data = _status(_open(config))
        if json_output:
            print(json.dumps(data))
            return
        table = Table(title=f"{data['pipeline']} → {data['table']} (batch {data['batch']})")
        for column in ("topic", "partition", "committed", "end", "lag"):
            table.add_column(column, justify="right" if column != "topic" else "left")
        for p in data["partitions"]:
            table.add_row(p["topic"], str(p["partition"]), str(p["committed"]), str(p["end"]), str(p["lag"]))
        out.print(table)
        out.print(f"total lag {data['lag']}; data complete through {_ms(data['valid_through_ms'])}")

    _guarded(json_output, body)


@app.command()
def history(
    config: ConfigOption,
    json_output: JsonOption = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Newest N batches.")] = 50,
) -> None:
    """The pipeline's snapshots: batch number, offset ranges, counts."""
    from ingest import report

    def body() -> None:
        rows = report.history(_open(config), limit=limit)
        if json_output:
            print(json.dumps(rows))
            return
        table = Table(title="batches (newest first)")
        for column in ("batch", "snapshot", "committed at", "records", "dead letters", "ranges"):
            table.add_column(column)
        for row in rows:
            ranges = ", ".join(f"{r['topic']}[{r['partition']}] {r['start']}..{r['end']}" for r in row["ranges"])
            table.add_row(
                str(row["batch"]),
                str(row["snapshot_id"]),
                _ms(row["timestamp_ms"]),
                str(row["records"]),
                str(row["dead_letters"]),
                ranges or "(ledger only)",
            )
        out.print(table)

    _guarded(json_output, body)


@app.command()
def verify(config: ConfigOption, json_output: JsonOption = False) -> None:
    """Exit 0 only if every ledger offset still in Kafka is in the table or dead letters exactly once."""
    from ingest import report

    def body() -> None:
        data = report.verify(_open(config))
        if json_output:
            print(json.dumps(data))
        else:
            table = Table(title=f"verify {data['pipeline']}")
            for column in ("partition", "range", "in kafka", "rows", "dead letters", "result"):
                table.add_column(column)
            for p in data["partitions"]:
                problems = [f"{k} {p[k]}" for k in ("missing", "duplicated", "unexpected") if p[k]]
                table.add_row(
                    f"{p['topic']}[{p['partition']}]",
                    f"[{p['start']}, {p['end']})",
                    str(p["in_kafka"]),
                    str(p["rows"]),
                    str(p["dead_letters"]),
                    "ok" if p["ok"] else "; ".join(problems),
                )
            out.print(table)
        if not data["ok"]:
            raise VerificationFailed(
                "verification failed: offsets are missing, duplicated or unexpected (listed above, "
                f"at most {20} per kind and partition)"
            )
        if not json_output:
            out.print("[bold green]ok[/]: every offset is in the table or the dead letters exactly once")

    _guarded(json_output, body)


@app.command()
def demo(
    records: Annotated[int, typer.Option(help="Order events to produce.")] = 200_000,
    config: Annotated[Path, typer.Option("--config", "-c", help="Pipeline YAML for the demo.")] = Path(
        "conf/orders.yaml"
    ),
) -> None:
    """Start the embedded broker, produce order events, ingest them, show the result, stop."""
    from ingest import demo as demo_module

    _guarded(False, lambda: demo_module.main(records=records, config_path=config, console=out))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted: nothing half-committed is visible; run again to continue")
        sys.exit(130)
    except SystemExit:
        raise
    except BaseException:
        err.print_exception()
        sys.exit(int(ExitCode.INTERNAL))
