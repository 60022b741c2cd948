"""The ``ingest`` command line: rich output for people, ``--json`` for machines.

Exit codes (see :class:`ingest.errors.ExitCode`): 0 success, 75 retryable failure, 65 fatal
failure (data loss, ledger lost, verification failed), 78 configuration error, 1 internal error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ingest import api, nogc
from ingest.config import PipelineConfig
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
TableOption = Annotated[
    str | None,
    typer.Option(
        "--table",
        "-t",
        help="With `tables:` in the config, the table to act on (run, status, history, verify, check and maintain "
        "take every table without it).",
        show_default=False,
    ),
]


def _verbose(on: bool) -> None:
    if on:
        logging.getLogger().setLevel(logging.INFO)


#: ``-v`` after the subcommand too (``ingest run -c x.yaml -v``), as before it
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", callback=_verbose, help="Log progress to stderr.", show_default=False)
]


class LogFormat(StrEnum):
    text = "text"
    json = "json"


def _log_format(chosen: LogFormat) -> LogFormat:
    """Log lines (stderr) as text, or as one JSON object each (``time``, ``level``, ``logger``,
    ``message``, and what the line is about: ``pipeline``, ``batch``, ``snapshot_id``, counts) for
    a log shipper."""
    if chosen is LogFormat.json:
        from pythonjsonlogger.json import JsonFormatter

        from ingest.logcontext import Fields

        formatter = JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )
        for handler in logging.getLogger().handlers:
            handler.setFormatter(formatter)
            if not any(isinstance(f, Fields) for f in handler.filters):
                handler.addFilter(Fields())
    return chosen


LogFormatOption = Annotated[
    LogFormat, typer.Option("--log-format", callback=_log_format, help="Log lines as text or JSON (one object each).")
]
T = TypeVar("T")
R = TypeVar("R")


class EngineName(StrEnum):
    local = "local"
    spark = "spark"


EngineOption = Annotated[
    EngineName,
    typer.Option(
        "--engine",
        help="local: read, decode and write in this process. spark: in Spark tasks (needs "
        "'lakehouse-ingest\\[spark]'; Spark settings from spark-submit and spark-defaults.conf).",
    ),
]

#: ``ingest run``'s exit code after SIGTERM stopped it between batches (128 + SIGTERM, as a shell reports it)
STOPPED_EXIT = 143

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
        _fail(error, json_output)


def _fail(error: IngestError, json_output: bool) -> NoReturn:
    """Say why on stderr (and, with ``--json``, as the one JSON document on stdout), then exit with
    the error's code."""
    kind = "retryable" if error.retryable else ("config" if isinstance(error, ConfigError) else "fatal")
    if json_output:
        print(json.dumps({"error": str(error), "kind": kind, "type": type(error).__name__}))
    err.print(
        f"[bold red]error[/] ({kind}, {type(error).__name__}): {escape(str(error))}",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(int(error.exit_code)) from None


def _routes(path: Path, table: str | None) -> list[PipelineConfig]:
    """The tables ``--table`` names: that one, or every table of the config."""
    from ingest.config import chosen, load_routes

    routes = load_routes(path)
    return [chosen(routes, str(path), table)] if table is not None else routes


def _one(path: Path, table: str | None) -> PipelineConfig:
    """The table a command acts on: the config's only one, or the one ``--table`` names."""
    from ingest.config import load

    return load(path, table=table)


def _each(
    json_output: bool,
    routes: list[PipelineConfig],
    act: Callable[[PipelineConfig], R],
    data: Callable[[R], object],
    show: Callable[[R], None],
) -> list[R]:
    """``act`` on each table, its result emitted as it comes: for a config of one table as
    :func:`_emit` does; of several, under the table's name (``--json``: a document per line, the
    table's result with ``"table"`` added)."""
    results = []
    failures: list[IngestError] = []
    for route in routes:
        if len(routes) == 1:
            result = act(route)
            results.append(result)
            _emit(json_output, data(result), lambda: show(result))  # noqa: B023 (called at once)
            continue
        try:
            result = act(route)
        except IngestError as error:  # the other tables are still reported; the first failure is the command's
            failures.append(error)
            if json_output:
                print(json.dumps({"table": route.table, "error": str(error), "type": type(error).__name__}))
            err.print(f"[red]{route.table}[/] ({type(error).__name__}): {escape(str(error))}", highlight=False)
            continue
        results.append(result)
        document = data(result)
        if json_output:
            print(json.dumps({"table": route.table, **document} if isinstance(document, dict) else
                             {"table": route.table, "entries": document}), flush=True)  # fmt: skip
        else:
            out.rule(f"[bold]{route.table}", align="left")
            show(result)
    if failures:
        raise _first(failures)
    return results


def _first(failures: list[IngestError]) -> IngestError:
    """The failure a command of several tables exits with: the first fatal one, else the first."""
    return next((error for error in failures if not error.retryable), failures[0])


def _emit(json_output: bool, data: object, show: Callable[[], None]) -> None:
    """A command's result: as one line of JSON (``--json``), or rendered for people (:mod:`ingest.render`)."""
    if json_output:
        print(json.dumps(data), flush=True)
    else:
        show()


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        print(f"lakehouse-ingest {version('lakehouse-ingest')}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
    log_format: Annotated[
        LogFormat, typer.Option("--log-format", help="Log lines as text or JSON (one object each).")
    ] = LogFormat.text,
) -> None:
    if ctx.invoked_subcommand != "run":  # a run's imports are over once it is open (_open_run)
        nogc.started()
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    _log_format(log_format)


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
) -> None:
    """Commit micro-batches (default: one batch). Safe to retry and to run concurrently."""
    if until_caught_up and every:
        raise typer.BadParameter("use either --until-caught-up or --every")
    interval = parse_duration(every) if every else None
    if interval is not None and interval < 1:
        raise typer.BadParameter(f"--every {every} would run without pause; give at least 1s", param_hint="--every")
    stop = threading.Event()  # SIGTERM (Airflow killing the task, a pod stopping): finish the batch in flight

    def body() -> None:
        from ingest.driver import Schedule, drive

        schedule = Schedule(until_caught_up, max_batches, interval)
        routes = _routes(config, table)
        shown = _Shown(json_output, several=len(routes) > 1, catch_up=schedule.catches_up)
        drive(routes, shown, schedule, engine.value, stop)  # type: ignore[arg-type]
        if stop.is_set():
            err.print(
                "stopped by SIGTERM between batches: every batch that began was committed or left no trace; "
                f"run again to continue (exit {STOPPED_EXIT})",
                highlight=False,
            )
            raise typer.Exit(STOPPED_EXIT)

    if threading.current_thread() is not threading.main_thread():  # called as a function (a test, a thread)
        _guarded(json_output, body)
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        _guarded(json_output, body)
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Shown:
    """What ``ingest run`` shows of its batches (a :class:`ingest.driver.Watcher`): a line each (or
    ``--json``), a progress bar of the catch-up on a terminal, and the failures it rides out."""

    def __init__(self, json_output: bool, *, several: bool, catch_up: bool) -> None:
        self.json_output, self.several, self.catch_up = json_output, several, catch_up
        self._advance: Callable[[int], None] = lambda n: None

    @contextlib.contextmanager
    def tick(self, run: Any) -> Iterator[None]:
        pipeline = run.pipeline
        if self.several and not self.json_output:
            out.print(f"[bold]{pipeline.config.table}[/]", highlight=False)
        show_progress = self.catch_up and not self.json_output and err.is_terminal
        total = _status(pipeline).lag if show_progress else 0
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
            self._advance = lambda n: progress.advance(task, n)
            yield

    def batch(self, run: Any, result: Any) -> None:
        from ingest import render

        self._advance(result.records + result.dead_letters)
        if self.json_output:
            print(json.dumps({**result.as_dict(), "table": run.pipeline.config.table}), flush=True)
        else:
            render.batch(result, out)

    def failed(self, config: PipelineConfig, error: Exception) -> None:
        kind = "retryable" if getattr(error, "retryable", False) else "fatal"
        err.print(f"[red]{config.table}[/] ({kind}, {type(error).__name__}): {escape(str(error))}")

    def retrying(self, why: str, every_s: float) -> None:
        err.print(f"[yellow]retryable[/] {escape(why)}; next try in {every_s:.0f}s")


def _status(pipeline: Any) -> Any:
    from ingest.ops import report

    return report.status(pipeline)


@app.command()
def check(
    config: ConfigOption,
    table: TableOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Check the config against Kafka, the registry, the catalog and the tables, changing nothing."""

    def body() -> None:
        from ingest import render

        results = _each(
            json_output, _routes(config, table), api.check, lambda r: r.as_dict(), lambda r: render.check(r, out)
        )
        failed = [result for result in results if not result.ok]
        if failed:
            raise typer.Exit(failed[0].exit_code)

    _guarded(json_output, body)


@app.command()
def status(
    config: ConfigOption,
    table: TableOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Per partition: the committed offset, the end offset, and the lag."""

    def body() -> None:
        from ingest import render

        routes = _routes(config, table)
        results = _each(json_output, routes, api.status, lambda r: r.as_dict(), lambda r: render.status(r, out))
        if len(routes) > 1 and not json_output:
            out.print(f"{len(routes)} tables: lag {sum(r.lag for r in results):,} records in all")

    _guarded(json_output, body)


@app.command()
def history(
    config: ConfigOption,
    table: TableOption = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
    json_output: JsonOption = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Newest N batches.")] = 50,
) -> None:
    """The pipeline's snapshots: batch number, offset ranges, counts."""

    def body() -> None:
        from ingest import render

        _each(
            json_output,
            _routes(config, table),
            lambda route: api.history(route, limit=limit),
            lambda entries: [e.as_dict() for e in entries],
            lambda entries: render.history(entries, out),
        )

    _guarded(json_output, body)


@app.command()
def verify(
    config: ConfigOption,
    table: TableOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Exit 0 only if every ledger offset still in Kafka is in the table or dead letters exactly once."""
    from ingest.ops import verify as verifying

    def body() -> None:
        from ingest import render

        routes = _routes(config, table)
        results = _each(json_output, routes, api.verify, lambda r: r.as_dict(), lambda r: render.verification(r, out))
        if len(routes) > 1 and not json_output:
            ok = sum(result.ok for result in results)
            out.print(f"{ok} of {len(routes)} tables verified" + ("" if ok < len(routes) else ": ok"))
        if not all(result.ok for result in results):
            failed = VerificationFailed(
                "verification failed: offsets are missing, duplicated (as rows or dead letters), unexpected, or both "
                f"a row and a dead letter (listed above, at most {verifying.SAMPLE} per kind and partition)"
            )
            _fail(failed, json_output=False)  # with --json, the result above is the one document

    _guarded(json_output, body)


@app.command()
def maintain(
    config: ConfigOption,
    table: TableOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Compact small files, expire old snapshots and remove orphan files, keeping every ledger."""

    def body() -> None:
        from ingest import render

        routes = _routes(config, table)
        _each(json_output, routes, api.maintain, lambda r: r.as_dict(), lambda r: render.maintenance(r, out))

    _guarded(json_output, body)


@app.command()
def redrive(
    config: ConfigOption,
    table: TableOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Decode and report; change nothing.")] = False,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Decode the dead letters again (after a fix) and move those that decode now to the table, exactly once."""

    def body() -> None:
        from ingest import render

        result = api.redrive(_one(config, table), dry_run=dry_run)
        _emit(json_output, result.as_dict(), lambda: render.redrive(result, out))

    _guarded(json_output, body)


@app.command("evolve-partitioning")
def evolve_partitioning(
    config: ConfigOption,
    table: TableOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say how the spec would change; change nothing.")] = False,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Evolve the table's partition spec to partition_by (new data follows it; files written before keep theirs)."""

    def body() -> None:
        from ingest import render

        result = api.evolve_partitioning(_one(config, table), dry_run=dry_run)
        _emit(json_output, result.as_dict(), lambda: render.repartitioned(result, out))

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
    table: TableOption = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
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
        from ingest import render

        result = api.reset(_one(config, table), target, reason, reset_id)
        _emit(json_output, result.as_dict(), lambda: render.reset(result, out, err))

    _guarded(json_output, body)


@app.command()
def replay(
    config: ConfigOption,
    table: TableOption = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
    from_snapshot: Annotated[int | None, typer.Option("--from-snapshot", help="Snapshot id S to replay from.")] = None,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Replay from main as of this ISO-8601 time.")] = None,
    publish: Annotated[bool, typer.Option("--publish", help="Move main to the caught-up replay branch.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Roll main back to S instead of branching.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Re-ingest everything after snapshot S: into a branch (default), or by rolling main back."""

    if (from_snapshot is None) == (as_of is None):
        raise typer.BadParameter("give exactly one of --from-snapshot or --as-of")
    if publish and rollback:
        raise typer.BadParameter("use either --publish or --rollback")

    def body() -> None:
        from ingest import render
        from ingest.driver import running

        chosen = api.not_routed(_one(config, table), "ingest replay")  # before anything is opened
        with running(chosen) as opened_run:  # one worker pool for every catch-up
            result = api.replay(
                opened_run, from_snapshot, _timestamp_ms(as_of) if as_of else None, publish=publish, rollback=rollback
            )
        _emit(json_output, result.as_dict(), lambda: render.replay(result, out))

    _guarded(json_output, body)


@app.command()
def demo(
    records: Annotated[int, typer.Option(help="Order events to produce.")] = 200_000,
    config: Annotated[Path, typer.Option("--config", "-c", help="Pipeline YAML for the demo.")] = Path(
        "conf/orders.yaml"
    ),
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
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
