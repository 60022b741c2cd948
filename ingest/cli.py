"""The ``ingest`` command line: rich output for people, ``--json`` for machines.

Exit codes (see :class:`ingest.errors.ExitCode`): 0 success, 75 retryable failure, 65 fatal
failure (data loss, ledger lost, verification failed), 78 configuration error, 1 internal error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ingest import config as config_module
from ingest.errors import ConfigError, ExitCode, IngestError, RetryableError, VerificationFailed

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


class EngineName(StrEnum):
    local = "local"
    spark = "spark"


EngineOption = Annotated[
    EngineName,
    typer.Option(
        "--engine",
        help="local: read, decode and write in this process. spark: in Spark tasks (needs "
        "'lakehouse-ingest[spark]'; Spark settings from spark-submit and spark-defaults.conf).",
    ),
]

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
        err.print(
            f"[bold red]error[/] ({kind}, {type(error).__name__}): {escape(str(error))}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(int(error.exit_code)) from None


def _open(path: Path) -> Any:
    return _pipeline(config_module.load(path))


def _pipeline(config: Any) -> Any:
    from ingest.pipeline import Pipeline

    return Pipeline.open(config)


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
    engine: EngineOption = EngineName.local,
    json_output: JsonOption = False,
) -> None:
    """Commit micro-batches (default: one batch). Safe to retry and to run concurrently."""
    if until_caught_up and every:
        raise typer.BadParameter("use either --until-caught-up or --every")
    interval = parse_duration(every) if every else None

    def body() -> None:
        with _open_run(config, engine) as opened_run:  # one engine (one Spark session) for every batch
            while True:
                started = time.monotonic()
                try:
                    _run_once(opened_run, until_caught_up or interval is not None, max_batches, json_output)
                except RetryableError as error:
                    if interval is None:
                        raise
                    # a long-running --every loop rides out what the next tick can fix; fatal errors stop it
                    err.print(
                        f"[yellow]retryable[/] ({type(error).__name__}): {escape(str(error))}; "
                        f"next try in {interval:.0f}s"
                    )
                if interval is None:
                    return
                time.sleep(max(0.0, interval - (time.monotonic() - started)))

    _guarded(json_output, body)


@contextlib.contextmanager
def _open_run(path: Path, name: EngineName) -> Iterator[Any]:
    """The run (pipeline and the engine ``--engine`` names) for every batch of the command."""
    from ingest.runner import opened  # imports no pyiceberg: workers start before it is

    with opened(config_module.load(path), "spark" if name is EngineName.spark else "local") as run:
        yield run


def _run_once(run: Any, catch_up: bool, max_batches: int | None, json_output: bool) -> None:
    pipeline = run.pipeline
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
        for result in run.batches(until_caught_up=catch_up, max_batches=max_batches):
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
    from ingest.ops import report

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
    from ingest.ops import report

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
    from ingest.ops import report

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
def maintain(config: ConfigOption, json_output: JsonOption = False) -> None:
    """Compact small files, expire old snapshots and remove orphan files, keeping every ledger."""
    from ingest.ops.maintain import maintain as do_maintain

    def body() -> None:
        data = do_maintain(_open(config))
        if json_output:
            print(json.dumps(data))
            return
        for label in ("table", "dead_letters"):
            r = data[label]
            out.print(
                f"{label}: {r['files_removed']} small files rewritten into {r['files_added']}, "
                f"{r['snapshots_expired']} snapshots expired, {r['orphans_removed']} orphan files removed"
            )

    _guarded(json_output, body)


def _timestamp_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO-8601 timestamp, e.g. 2026-12-01T10:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@app.command()
def reset(
    config: ConfigOption,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the snapshot summary).")],
    to_offsets: Annotated[
        str | None,
        typer.Option(
            "--to-offsets",
            help="TOPIC:PARTITION=OFFSET[,...]; other partitions keep theirs (name all if the ledger is lost).",
        ),
    ] = None,
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="Every partition to its earliest offset.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="Every partition to its end offset.")] = False,
    to_timestamp: Annotated[
        str | None, typer.Option("--to-timestamp", help="First offsets at or after an ISO-8601 timestamp.")
    ] = None,
    from_table: Annotated[
        bool,
        typer.Option(
            "--from-table",
            help="Rebuild a lost ledger (and a lost dead-letter ledger) exactly from the Kafka coordinates "
            "stored in the table and its dead letters: the fix for 'ledger lost'.",
        ),
    ] = False,
    reset_id: Annotated[
        str | None, typer.Option("--reset-id", help="Id that makes the reset apply once (default: from the command).")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Move the ledger without data (one snapshot, applied once even if the command is re-run).

    Also works when the ledger is lost (expired or rewritten away by another tool); --from-table
    then resumes exactly where the data in the tables ends.
    """
    from ingest.ops.reset import ResetTarget, parse_offsets
    from ingest.ops.reset import reset as do_reset

    chosen = [x for x in (to_offsets, to_earliest or None, to_latest or None, to_timestamp, from_table or None) if x]
    if len(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-offsets, --to-earliest, --to-latest, --to-timestamp, --from-table"
        )

    def body() -> None:
        if to_offsets:
            target = ResetTarget("offsets", offsets=parse_offsets(to_offsets))
        elif to_timestamp:
            target = ResetTarget("timestamp", timestamp_ms=_timestamp_ms(to_timestamp))
        elif from_table:
            target = ResetTarget("table")
        else:
            target = ResetTarget("earliest" if to_earliest else "latest")
        data = do_reset(_open(config), target, reason, reset_id)
        if json_output:
            print(json.dumps(data))
        else:
            _print_reset(data)

    _guarded(json_output, body)


def _print_reset(data: dict[str, Any]) -> None:
    out.print(f"reset {data['reset_id']}: [bold]{data['status']}[/] (snapshot {data['snapshot_id']})", highlight=False)
    if "note" in data:
        out.print(data["note"], highlight=False)
    if data["status"] != "applied":
        return
    if data["recovered"]:
        out.print(f"the lost ledger of {data['pipeline']!r} was replaced", highlight=False)
    for p in data["offsets"]:
        basis = {"low-watermark": " (no record in the table: earliest retained offset)"}.get(p.get("basis", ""), "")
        out.print(f"  {p['topic']}[{p['partition']}]: {p['from']} -> {p['to']}{basis}", highlight=False)
    if "dead_letter_floor" in data:
        out.print(
            f"the lost dead-letter ledger was rebuilt (snapshot {data['dead_letter_floor']['snapshot_id']})",
            highlight=False,
        )
    if data.get("dead_letter_ledger_lost"):
        err.print(
            "[yellow]warning[/]: the dead-letter table's ledger is lost too; the first batch with a dead letter "
            "will fail until `ingest reset --from-table` rebuilds it",
            highlight=False,
        )


@app.command()
def replay(
    config: ConfigOption,
    from_snapshot: Annotated[int | None, typer.Option("--from-snapshot", help="Snapshot id S to replay from.")] = None,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Replay from main as of this ISO-8601 time.")] = None,
    publish: Annotated[bool, typer.Option("--publish", help="Move main to the caught-up replay branch.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Roll main back to S instead of branching.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Re-ingest everything after snapshot S: into a branch (default), or by rolling main back."""
    from ingest.ops.replay import replay as do_replay

    if (from_snapshot is None) == (as_of is None):
        raise typer.BadParameter("give exactly one of --from-snapshot or --as-of")
    if publish and rollback:
        raise typer.BadParameter("use either --publish or --rollback")

    def body() -> None:
        with _open_run(config, EngineName.local) as opened_run:  # one worker pool for every catch-up
            data = do_replay(
                opened_run, from_snapshot, _timestamp_ms(as_of) if as_of else None, publish=publish, rollback=rollback
            )
        if json_output:
            print(json.dumps(data))
            return
        out.print(f"replay from snapshot {data['from_snapshot']}: {data['action']}")
        if "comparison" in data:
            table = Table(title=f"main vs {data['branch']}")
            for column in ("partition", "main offset", "branch offset", "main rows", "branch rows"):
                table.add_column(column)
            for r in data["comparison"]:
                table.add_row(
                    f"{r['topic']}[{r['partition']}]",
                    str(r["main_offset"]),
                    str(r["branch_offset"]),
                    str(r["main_rows"]),
                    str(r["branch_rows"]),
                )
            out.print(table)
            if not publish:
                out.print("nothing published: re-run with --publish to move main to the branch")

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
