"""What every ``ingest`` command shares: the application, its consoles and options, and how a
result or an error is shown (rich output for people, ``--json`` for machines)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ingest import durations, nogc
from ingest.config import PipelineConfig
from ingest.errors import ConfigError, IngestError

app = typer.Typer(
    name="ingest",
    help="Exactly-once Kafka to Apache Iceberg micro-batches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# soft wrap: a line is never broken at the console's width when not on a terminal (80 columns:
# logs of Airflow, cron and containers), so a log shipper sees each message and result whole
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
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


def parse_duration(text: str) -> float:
    """``300``, ``30s``, ``5m``, ``1h`` or ``250ms`` as seconds (:mod:`ingest.durations`)."""
    try:
        return durations.seconds(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def guarded(json_output: bool, action: Callable[[], T]) -> T:
    """Run a command body; map domain errors to their exit codes with a message that says why."""
    try:
        return action()
    except IngestError as error:
        fail(error, json_output)


def fail(error: IngestError, json_output: bool) -> NoReturn:
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


def routes_of(path: Path, table: str | None) -> list[PipelineConfig]:
    """The tables ``--table`` names: that one, or every table of the config."""
    from ingest.config import chosen, load_routes

    routes = load_routes(path)
    return [chosen(routes, str(path), table)] if table is not None else routes


def one_of(path: Path, table: str | None) -> PipelineConfig:
    """The table a command acts on: the config's only one, or the one ``--table`` names."""
    from ingest.config import load

    return load(path, table=table)


def each(
    json_output: bool,
    routes: list[PipelineConfig],
    act: Callable[[PipelineConfig], R],
    data: Callable[[R], object],
    show: Callable[[R], None],
) -> list[R]:
    """``act`` on each table, its result emitted as it comes: for a config of one table as
    :func:`emit` does; of several, under the table's name (``--json``: a document per line, the
    table's result with ``"table"`` added)."""
    results = []
    failures: list[IngestError] = []
    for route in routes:
        if len(routes) == 1:
            result = act(route)
            results.append(result)
            emit(json_output, data(result), lambda: show(result))  # noqa: B023 (called at once)
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


def emit(json_output: bool, data: object, show: Callable[[], None]) -> None:
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
