"""``ingest verify``: the tables set against what the ledger history claims, at their heads.

Every offset of the ledger's ranges that Kafka still holds must be in the rows or the dead letters
exactly once (a backward reset adds one more copy of what it read again), and no row may lie
outside them; each kind of problem is named with its offsets (:data:`Problem`), and the snapshots
of other writers that changed them since the pipeline's last commit (:mod:`ingest.ops.blame`).
What the history claims comes from the pure :mod:`ingest.core.coverage`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest import records
from ingest.assembly import Opened, routed_tables
from ingest.committer import observe
from ingest.config import PipelineConfig
from ingest.core.coverage import Coverage, coverage
from ingest.core.ledger import Found, TopicPartition
from ingest.core.plan import Watermarks, check_topic_ids
from ingest.core.ranges import Range
from ingest.engines.task_spec import TaskSpec
from ingest.errors import TopicIdChanged
from ingest.iceberg.reading import read_written
from ingest.iceberg.table import IcebergTable
from ingest.ops.blame import Change, blame
from ingest.ops.report import Span
from ingest.ops.verify_changes import changelog_checks
from ingest.ops.verify_reads import expected_reads
from ingest.ops.verify_report import PROBLEMS, SAMPLE, PartitionCheck, Problem, offsets_by_partition, sample
from ingest.siblings import for_table


def _counts(values: pa.Array, of: pa.Array) -> pa.Array:
    """How many times each of ``values`` is in ``of``."""
    if not len(of):
        return pa.array([0] * len(values), pa.int64())
    counts = pc.value_counts(of)
    found = pc.take(counts.field("counts"), pc.index_in(values, counts.field("values")))
    return pc.fill_null(pc.cast(found, pa.int64()), 0)


def judge_partition(
    span: Range,
    end: int,
    kafka: pa.Array,
    rows: pa.Array,
    dead: pa.Array,
    claims: Coverage,
) -> PartitionCheck:
    """Check one partition: ``kafka`` holds the offsets Kafka has in ``span`` (from the lowest
    offset the history accounts for to the ledger's ``end``, or past it to the top of what a
    backward reset left to be read again); ``rows`` and ``dead`` are the offsets of the rows and
    dead letters (each as many times as stored)."""
    tp, start, top = span
    check = PartitionCheck(tp, start, end, top)
    # dead letters past that are normal after a crash between the two commits
    dead = dead.filter(pc.less(dead, top)) if len(dead) else dead
    held = kafka
    if len(kafka):
        kafka = kafka.filter(pc.greater(expected_reads(kafka, claims, tp, end), 0))
    check.in_kafka, check.rows, check.dead_letters = len(kafka), len(rows), len(dead)
    found: dict[Problem, set[int]] = {kind: set() for kind in PROBLEMS}
    landed = pa.concat_arrays([rows, dead])
    if len(landed):
        values = pc.unique(landed)
        in_rows, in_dead = _counts(values, rows), _counts(values, dead)
        expected = expected_reads(values, claims, tp, end)
        # below the range checked (before a lost or expired ledger history) a row may be there once
        expected = pc.if_else(pc.less(values, start), pc.max_element_wise(expected, 1), expected)
        # a good record is in the rows as many times as the ledger read it; a poison record is a
        # dead letter once (their ledger deduplicates re-reads), also where a forward reset skipped
        # what a batch it fenced had already dead-lettered; a record a backward reset had read again
        # may be a dead letter once and a row for the other reads (a decoding fixed in between)
        is_dead = pc.greater(in_dead, 0)
        once = pc.less_equal(expected, 1)
        rows_allowed = pc.if_else(is_dead, pc.max_element_wise(pc.subtract(expected, 1), 1), expected)
        nowhere = pc.and_(pc.invert(is_dead), pc.less_equal(expected, 0))
        found["duplicated_dead_letters"].update(sample(values.filter(pc.greater(in_dead, 1))))
        in_both = pc.and_(pc.and_(is_dead, pc.greater(in_rows, 0)), once)
        found["in_both_tables"].update(sample(values.filter(in_both)))
        too_many = pc.and_(pc.greater(in_rows, rows_allowed), pc.invert(nowhere))
        found["duplicated"].update(sample(values.filter(too_many)))
        too_few = pc.and_(pc.invert(is_dead), pc.less(in_rows, expected))
        found["missing"].update(sample(values.filter(pc.and_(too_few, pc.greater_equal(values, start)))))
        in_range = landed.filter(pc.and_(pc.greater_equal(landed, start), pc.less(landed, top)))
        strays = in_range.filter(pc.invert(pc.is_in(in_range, held))) if len(held) else in_range
        found["unexpected"].update(sample(values.filter(nowhere)) + sample(strays))
    if len(kafka):
        absent = kafka.filter(pc.invert(pc.is_in(kafka, landed))) if len(landed) else kafka
        found["missing"].update(sample(absent))
    check.found = {kind: sorted(offsets)[:SAMPLE] for kind, offsets in found.items() if offsets}
    return check


@dataclass(frozen=True)
class Verification:
    """``ingest verify``: every offset of the ledger's ranges Kafka still holds, in the tables
    exactly once; ``ok`` only if every partition is."""

    pipeline: str
    snapshot_id: int | None
    batch: int | None
    #: ranges the ledger history says were deliberately not ingested (a skipped loss, a forward reset)
    excluded: tuple[Span, ...]
    #: ranges a backward reset made the pipeline ingest once more
    reread: tuple[Span, ...]
    partitions: tuple[PartitionCheck, ...]
    note: str | None = None
    #: the rows table's snapshot judged: its head (``snapshot_id`` is the pipeline's last commit)
    head_snapshot_id: int | None = None
    #: other writers' snapshots after the pipeline's last commit that changed offsets found wrong
    changes: tuple[Change, ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        if self.note is not None:
            return {"pipeline": self.pipeline, "ok": self.ok, "partitions": [], "note": self.note}
        return {
            "pipeline": self.pipeline,
            "ok": self.ok,
            "snapshot_id": self.snapshot_id,
            "head_snapshot_id": self.head_snapshot_id,
            "batch": self.batch,
            "excluded_ranges": [r.as_dict() for r in self.excluded],
            "reread_ranges": [r.as_dict() for r in self.reread],
            "partitions": [c.as_dict() for c in self.partitions],
            "changed_by_other_writers": [c.as_dict() for c in self.changes],
        }


def nothing_to_verify(config: PipelineConfig) -> Verification:
    """What ``verify`` says of a pipeline whose tables do not exist yet."""
    return Verification(
        config.pipeline, None, None, (), (), (), note=f"nothing committed yet (table {config.table} does not exist)"
    )


def _rows_tables(pipeline: Opened) -> list[tuple[IcebergTable, int | None]]:
    """The tables the pipeline's rows are in, each with its head as read now: the rows table (at the
    head the ledger was just found on), or (``route_by``) every routed table."""
    tables = [(pipeline.rows, pipeline.rows.head().snapshot_id)]  # (route_by: the ledger's table has none)
    for table in routed_tables(pipeline).values():
        tables.append((table, table.refresh().snapshot_id))
    return tables


def _rows_coordinates(tables: list[tuple[IcebergTable, int | None]]) -> pa.Table:
    """The coordinates of every row of ``tables`` at the heads given (only these columns are read)."""
    r = records.ROWS
    columns = [r.topic, r.partition, r.offset]
    empty = pa.schema(r.fields()[:3]).empty_table()
    scans = [table.scan_columns(columns, head) for table, head in tables if head is not None]
    return pa.concat_tables([empty, *scans], promote_options="permissive")


def _owed_dead_letters(pipeline: Opened, found: Found) -> pa.Table | None:
    """The coordinates of the dead letters the rows head's batch has not added to the dead-letter
    table yet (see :mod:`ingest.batch_commit`): written, in files its marker names."""
    sync = found.ledger.sync
    if sync is None or sync.files is None:
        return None
    floor = observe(pipeline.dead, pipeline.config.pipeline, recovering=True)
    if floor is not None and floor.ledger.remembers(sync.sync_id):
        return None
    d = records.DEAD_LETTERS
    return read_written(pipeline.dead, sync.files, [d.topic, d.partition, d.offset])


def _dead_letters_head(pipeline: Opened, found: Found) -> int | None:
    """The dead-letter table's snapshot to judge: its main head, or, while a publish whose rows step
    landed still owes its dead-letter step (a crash between the two tables, finished by the next
    run), the head of the branch that step makes main."""
    dead = pipeline.dead
    dead.refresh()
    sync = found.ledger.sync
    if sync is not None and sync.branch is not None:
        floor = observe(dead, pipeline.config.pipeline, math.inf, recovering=True)  # (refreshed above)
        branch_head = dead.branch_head(sync.branch)
        if branch_head is not None and not (floor is not None and floor.ledger.remembers(sync.sync_id)):
            return branch_head
    return dead.head().snapshot_id


def verify(pipeline: Opened) -> Verification:
    """Every offset of the ledger's ranges that Kafka still holds is in the table or the dead
    letters exactly once (a backward reset adds one more copy of what it re-read), and no row lies
    outside them. Each table is judged at its head, as its readers see it: where offsets are wrong,
    the snapshots other writers committed after the pipeline's last commit that changed them are
    named. Refuses (:class:`~ingest.errors.TopicIdChanged`) a topic Kafka knows by another id than
    the ledger: it cannot tell the new topic's records from the old one's."""
    name = pipeline.config.pipeline
    found = pipeline.ledger()
    if found is None:
        return Verification(name, None, None, (), (), (), note="nothing committed yet")
    rows_tables = _rows_tables(pipeline)
    claims = coverage(name, pipeline.rows.ancestry())
    view = pipeline.source.describe()
    try:  # a recreated topic's records at the ledger's offsets are not the ones the table holds
        check_topic_ids(found.ledger, view)
    except TopicIdChanged as error:
        raise for_table(pipeline.config, error) from None
    # per partition: the offsets to check (the ledger's range, and above it what a backward reset
    # left to be read again) and the ledger's end
    spans: list[tuple[Range, int]] = []
    for tp, end in sorted(found.ledger.offsets.items()):
        watermarks = view.partitions.get(tp, Watermarks(end, end))
        top = max(end, min(claims.top(tp, end), watermarks.high))
        spans.append(((tp, max(claims.lowest(tp, end), watermarks.low), top), end))
    r, d = records.ROWS, records.DEAD_LETTERS
    dead_head = _dead_letters_head(pipeline, found)
    if pipeline.config.changes is not None:  # a changelog: the table against the fold of its changes
        spec = TaskSpec.of(pipeline.config, pipeline.fields)
        columns = [*pipeline.config.changes.key, r.topic, r.partition, r.offset]
        dead = _dead_letters(pipeline, found, dead_head)
        read = pipeline.source.read([span for span, _ in spans])
        stored = pipeline.rows.scan_columns(columns, rows_tables[0][1])
        checks = changelog_checks(spec, spans, read, stored, dead, claims)
        return _verification(pipeline, found, claims, checks, rows_tables, dead_head)
    in_kafka: dict[TopicPartition, list[pa.Array]] = {}
    for chunk in pipeline.source.read([span for span, _ in spans]):
        table = pa.table({"t": chunk.topic, "p": chunk.partition, "o": chunk.offset})
        for tp, offsets in offsets_by_partition(table, "t", "p", "o").items():
            in_kafka.setdefault(tp, []).append(offsets)
    rows = _rows_coordinates(rows_tables)
    rows = rows.filter(pc.is_in(rows[r.topic], pa.array(pipeline.config.topics_in(found.ledger.topics), pa.string())))
    dead = _dead_letters(pipeline, found, dead_head)
    row_offsets = offsets_by_partition(rows, r.topic, r.partition, r.offset)
    dead_offsets = offsets_by_partition(dead, d.topic, d.partition, d.offset)
    empty = pa.array([], pa.int64())
    checks = []
    for span, end in spans:
        tp = span[0]
        kafka = pa.concat_arrays(in_kafka.get(tp, [empty]))
        mine = row_offsets.get(tp, empty)
        if pipeline.routes is not None and len(mine):  # rows past the ledger: a crash between the tables' commits
            mine = mine.filter(pc.less(mine, span[2]))
        checks.append(judge_partition(span, end, kafka, mine, dead_offsets.get(tp, empty), claims))
    return _verification(pipeline, found, claims, checks, rows_tables, dead_head)


def _dead_letters(pipeline: Opened, found: Found, head: int | None) -> pa.Table:
    """The coordinates of the dead letters at ``head``, and of those the rows head's batch owes."""
    d = records.DEAD_LETTERS
    dead = pipeline.dead.scan_columns([d.topic, d.partition, d.offset], head)
    owed = _owed_dead_letters(pipeline, found)
    if owed is not None:  # the batch's rows landed a moment ago, its dead letters are still in files
        dead = pa.concat_tables([dead, owed])
    return dead


def _verification(
    pipeline: Opened,
    found: Found,
    claims: Coverage,
    checks: list[PartitionCheck],
    rows_tables: list[tuple[IcebergTable, int | None]],
    dead_head: int | None,
) -> Verification:
    """The report of ``checks``, naming the other writers' snapshots that changed what is wrong."""
    name, r, d = pipeline.config.pipeline, records.ROWS, records.DEAD_LETTERS
    changes: list[Change] = []
    wrong = [c for c in checks if not c.ok][:SAMPLE]
    if wrong:  # who changed the offsets found wrong since the pipeline's last commit
        for table, head in rows_tables:
            changes += blame(table, name, r, _suspects(wrong, ROW_PROBLEMS), head)
        changes += blame(pipeline.dead, name, d, _suspects(wrong, DEAD_LETTER_PROBLEMS), dead_head)
    return Verification(
        name,
        found.snapshot_id,
        found.ledger.batch,
        tuple(Span.of(tp, lo, hi) for tp, lo, hi in claims.excluded),
        tuple(Span.of(tp, lo, hi) for tp, lo, hi in claims.reread),
        tuple(checks),
        head_snapshot_id=rows_tables[0][1],
        changes=tuple(changes),
    )


#: the problems a change to the rows table can cause, and a change to the dead-letter table
ROW_PROBLEMS: tuple[Problem, ...] = ("missing", "duplicated", "unexpected", "in_both_tables")
DEAD_LETTER_PROBLEMS: tuple[Problem, ...] = ("missing", "duplicated_dead_letters", "in_both_tables")


def _suspects(checks: Iterable[PartitionCheck], kinds: tuple[Problem, ...]) -> dict[TopicPartition, list[int]]:
    return {c.tp: sorted({o for kind in kinds for o in c.found.get(kind, [])}) for c in checks}
