"""What the ``ingest`` commands show people: every result type rendered with Rich, in one place.

Machines get each result's ``as_dict()`` as JSON (``--json``); nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:  # what is rendered, by type: a run's output imports none of the operations
    from ingest.batch_result import BatchResult
    from ingest.ops.check import CheckResult
    from ingest.ops.maintain import Maintenance
    from ingest.ops.partitioning import Repartitioned
    from ingest.ops.redrive import Redrive
    from ingest.ops.replay_result import ReplayResult
    from ingest.ops.report import BatchEntry, Status
    from ingest.ops.reset_command import ResetResult
    from ingest.ops.verify import Verification


#: each problem ``verify`` finds, as people read it (``--json`` has the names)
PROBLEM_WORDS = {
    "missing": "missing",
    "duplicated": "duplicated rows",
    "unexpected": "unexpected",
    "duplicated_dead_letters": "duplicated dead letters",
    "in_both_tables": "both a row and a dead letter",
}


def moment(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def batch(result: BatchResult, out: Console) -> None:
    out.print(
        f"batch {result.batch}: [bold]{result.status}[/] {result.records} rows, "
        f"{result.dead_letters} dead letters, {result.bytes / 1e6:.1f} MB in {result.seconds:.2f}s"
        + (f", {result.unknown_fields} with unknown fields" if result.unknown_fields else "")
        + (f" (snapshot {result.snapshot_id})" if result.snapshot_id else ""),
        highlight=False,
    )


def check(result: CheckResult, out: Console) -> None:
    for step in result.steps:
        mark = "[bold green]ok[/]" if step.ok else "[bold red]failed[/]"
        out.print(f"{mark} {step.name}: {escape(step.detail)}", highlight=False)
    if result.ok:
        out.print(f"[bold green]ok[/]: {result.pipeline} can run; nothing was changed")


def status(result: Status, out: Console) -> None:
    batch = f"batch {result.batch}" if result.batch is not None else "no batch yet"
    table = Table(title=f"{result.pipeline} → {result.table} ({batch})")
    for column in ("topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="right" if column != "topic" else "left")
    for p in result.partitions:
        committed = str(p.committed) if p.committed is not None else "-"
        table.add_row(p.topic, str(p.partition), committed, str(p.end), str(p.lag))
    out.print(table)
    if result.note is not None:
        out.print(result.note, highlight=False)
    out.print(f"total lag {result.lag}; data complete through {moment(result.valid_through_ms)}")
    dead = result.dead_letters
    if dead.count:
        out.print(
            f"{dead.count} dead letters, the newest of {moment(dead.newest_ms)}; the newest are:", highlight=False
        )
        for reason, count in dead.reasons:
            out.print(f"  {count}× {escape(reason)}", highlight=False)
    else:
        out.print("no dead letters", highlight=False)


def history(entries: Sequence[BatchEntry], out: Console) -> None:
    if not entries:
        out.print("no batches yet: nothing was committed", highlight=False)
        return
    table = Table(title="batches (newest first)")
    for column in ("batch", "snapshot", "committed at", "records", "dead letters"):
        # a snapshot id is what `replay --from-snapshot` takes: never cut, whatever the terminal's width
        table.add_column(column, no_wrap=column == "snapshot", min_width=19 if column == "snapshot" else None)
    # a range a line, folded rather than cut where the terminal is narrow: every offset stays readable
    table.add_column("ranges", overflow="fold", ratio=1)
    for entry in entries:
        ranges = "\n".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in entry.ranges)
        if entry.redriven:
            listed = ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in entry.redriven[:3])
            more = f" and {len(entry.redriven) - 3} more" if len(entry.redriven) > 3 else ""
            ranges = f"redrive of dead letters {listed}{more}"
        table.add_row(
            str(entry.batch),
            str(entry.snapshot_id),
            moment(entry.timestamp_ms),
            str(entry.records),
            str(entry.dead_letters),
            ranges or "(ledger only)",
        )
    out.print(table)


def verification(result: Verification, out: Console) -> None:
    if result.note is not None:
        out.print(f"{result.pipeline}: {result.note}; there is nothing to verify", highlight=False)
        return
    table = Table(title=f"verify {result.pipeline}")
    for column in ("partition", "range", "in kafka", "rows", "dead letters", "result"):
        table.add_column(column)
    for p in result.partitions:
        problems = [f"{PROBLEM_WORDS[kind]} {found}" for kind, found in p.problems() if found]
        table.add_row(
            f"{p.tp.topic}[{p.tp.partition}]",
            f"[{p.start}, {p.end})"
            + (f" (+ to {p.top}, to read again)" if p.top is not None and p.top > p.end else ""),
            str(p.in_kafka),
            str(p.rows),
            str(p.dead_letters),
            "ok" if p.ok else "; ".join(problems),
        )
    out.print(table)
    for spans, what in (
        (result.reread, "re-read on purpose (a backward reset): expected once more in the rows"),
        (result.excluded, "skipped on purpose (a forward reset, or a loss with on_data_loss: skip): not expected"),
    ):
        if spans:
            listed = ", ".join(f"{s.topic}[{s.partition}] [{s.start}, {s.end})" for s in spans)
            out.print(f"{what}: {listed}", highlight=False)
    if result.head_snapshot_id != result.snapshot_id:
        out.print(
            f"checked at the rows table's head, snapshot {result.head_snapshot_id}, as readers see it; other writers "
            f"committed since the pipeline's last commit, snapshot {result.snapshot_id}",
            highlight=False,
        )
    for change in result.changes:
        for verb, offsets in (("removed", change.removed), ("added", change.added)):
            if offsets:
                operation = change.operation or "operation unknown"
                out.print(
                    f"{change.topic}[{change.partition}]: {change.what} at offsets {list(offsets)} {verb} by another "
                    f"writer's snapshot {change.snapshot_id} ({operation}) of {change.table}",
                    highlight=False,
                )
    if result.ok:
        out.print(
            "[bold green]ok[/]: every offset is in the table or the dead letters as many times as the ledger read it "
            "(once, unless a range above says otherwise)"
        )


def maintenance(result: Maintenance, out: Console) -> None:
    for label, done in (("table", result.table), ("dead_letters", result.dead_letters), *result.routed.items()):
        compaction = done.compaction
        skipped = (
            f" (compaction skipped: {compaction.skipped_delete_files} delete files)"
            if compaction.skipped_delete_files
            else ""
        )
        out.print(
            f"{label}: {compaction.files_removed} small files rewritten into {compaction.files_added}{skipped}, "
            f"{done.snapshots_expired} snapshots expired, {done.orphans_removed} orphan files removed"
        )


def redrive(result: Redrive, out: Console) -> None:
    if result.examined == 0:
        out.print(f"{result.pipeline}: no dead letters to redrive", highlight=False)
        return
    verb = "would be committed to the rows (dry run: nothing changed)" if result.dry_run else "committed to the rows"
    where = f" in snapshot(s) {', '.join(map(str, result.snapshots))}" if result.snapshots else ""
    out.print(
        f"{result.pipeline}: {result.examined} dead letters decoded again: [bold]{result.redriven}[/] {verb}{where}, "
        f"{result.still_dead} still dead letters",
        highlight=False,
    )
    for reason, count in result.reasons:
        out.print(f"  {count}× {escape(reason)}", highlight=False)


def reset(result: ResetResult, out: Console, err: Console) -> None:
    out.print(f"reset {result.reset_id}: [bold]{result.status}[/] (snapshot {result.snapshot_id})", highlight=False)
    if result.note is not None:
        out.print(result.note, highlight=False)
    if result.status != "applied":
        return
    if result.recovered:
        out.print(f"the lost ledger of {result.pipeline!r} was replaced", highlight=False)
    for move in result.offsets or ():
        basis = " (no record in the table: earliest retained offset)" if move.basis == "low-watermark" else ""
        out.print(f"  {move.topic}[{move.partition}]: {move.moved_from} -> {move.to}{basis}", highlight=False)
    if result.dead_letter_floor is not None:
        out.print(
            f"the lost dead-letter ledger was rebuilt (snapshot {result.dead_letter_floor.snapshot_id})",
            highlight=False,
        )
    if result.dead_letter_ledger_lost:
        err.print(
            "[yellow]warning[/]: the dead-letter table's ledger is lost too; the first batch with a dead letter "
            "will fail until `ingest reset --from-table` rebuilds it",
            highlight=False,
        )


def replay(result: ReplayResult, out: Console) -> None:
    out.print(f"replay from snapshot {result.from_snapshot}: {result.action}")
    if result.comparison is None:
        return
    table = Table(title=f"main vs {result.branch}")
    for column in ("partition", "main offset", "branch offset", "main rows", "branch rows"):
        table.add_column(column)
    for r in result.comparison:
        table.add_row(
            f"{r.topic}[{r.partition}]", str(r.main_offset), str(r.branch_offset), str(r.main_rows), str(r.branch_rows)
        )
    out.print(table)
    out.print("nothing published: re-run with --publish to move main to the branch")


def repartitioned(result: Repartitioned, out: Console) -> None:
    """``ingest evolve-partitioning``: the spec before and after."""

    def shown(spec: tuple[str, ...]) -> str:
        return f"[{', '.join(spec)}]" if spec else "unpartitioned"

    said = {
        "evolved": f"partitioned by {shown(result.before)} until now; new data by {shown(result.after)}",
        "unchanged": f"already partitioned by {shown(result.after)}, as configured: nothing to change",
        "dry-run": f"partitioned by {shown(result.before)}; would be by {shown(result.after)} (dry run)",
        "no-table": "does not exist yet: the first run creates it partitioned as configured",
    }[result.status]
    out.print(f"{result.table}: {said}", highlight=False)
