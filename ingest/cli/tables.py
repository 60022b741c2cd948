"""The commands that look at or change a pipeline's tables: ``check``, ``status``, ``history``,
``verify``, ``maintain``, ``redrive``, ``evolve-partitioning``, ``reset``, ``replay``, and ``demo``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from ingest import api
from ingest.cli.common import (
    ConfigOption,
    JsonOption,
    LogFormat,
    LogFormatOption,
    TableOption,
    VerboseOption,
    app,
    each,
    emit,
    err,
    fail,
    guarded,
    one_of,
    out,
    routes_of,
)
from ingest.errors import VerificationFailed


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

        results = each(
            json_output, routes_of(config, table), api.check, lambda r: r.as_dict(), lambda r: render.check(r, out)
        )
        failed = [result for result in results if not result.ok]
        if failed:
            raise typer.Exit(failed[0].exit_code)

    guarded(json_output, body)


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

        routes = routes_of(config, table)
        results = each(json_output, routes, api.status, lambda r: r.as_dict(), lambda r: render.status(r, out))
        if len(routes) > 1 and not json_output:
            out.print(f"{len(routes)} tables: lag {sum(r.lag for r in results):,} records in all")

    guarded(json_output, body)


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

        each(
            json_output,
            routes_of(config, table),
            lambda route: api.history(route, limit=limit),
            lambda entries: [e.as_dict() for e in entries],
            lambda entries: render.history(entries, out),
        )

    guarded(json_output, body)


@app.command()
def verify(
    config: ConfigOption,
    table: TableOption = None,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = LogFormat.text,
) -> None:
    """Exit 0 only if every ledger offset still in Kafka is in the table or dead letters exactly once."""
    from ingest.ops.verify_report import SAMPLE

    def body() -> None:
        from ingest import render

        routes = routes_of(config, table)
        results = each(json_output, routes, api.verify, lambda r: r.as_dict(), lambda r: render.verification(r, out))
        if len(routes) > 1 and not json_output:
            ok = sum(result.ok for result in results)
            out.print(f"{ok} of {len(routes)} tables verified" + ("" if ok < len(routes) else ": ok"))
        if not all(result.ok for result in results):
            failed = VerificationFailed(
                "verification failed: offsets are missing, duplicated (as rows or dead letters), unexpected, or both "
                f"a row and a dead letter (listed above, at most {SAMPLE} per kind and partition)"
            )
            fail(failed, json_output=False)  # with --json, the result above is the one document

    guarded(json_output, body)


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

        routes = routes_of(config, table)
        each(json_output, routes, api.maintain, lambda r: r.as_dict(), lambda r: render.maintenance(r, out))

    guarded(json_output, body)


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

        result = api.redrive(one_of(config, table), dry_run=dry_run)
        emit(json_output, result.as_dict(), lambda: render.redrive(result, out))

    guarded(json_output, body)


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

        result = api.evolve_partitioning(one_of(config, table), dry_run=dry_run)
        emit(json_output, result.as_dict(), lambda: render.repartitioned(result, out))

    guarded(json_output, body)


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
    from ingest.ops.reset_command import ResetTarget, parse_offsets

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

        result = api.reset(one_of(config, table), target, reason, reset_id)
        emit(json_output, result.as_dict(), lambda: render.reset(result, out, err))

    guarded(json_output, body)


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

        chosen = api.not_routed(one_of(config, table), "ingest replay")  # before anything is opened
        with running(chosen) as opened_run:  # one worker pool for every catch-up
            result = api.replay(
                opened_run, from_snapshot, _timestamp_ms(as_of) if as_of else None, publish=publish, rollback=rollback
            )
        emit(json_output, result.as_dict(), lambda: render.replay(result, out))

    guarded(json_output, body)
