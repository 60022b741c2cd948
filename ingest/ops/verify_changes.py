"""``ingest verify`` of a changelog pipeline (``changes:``): the table against the fold of the
changes Kafka still holds of the ledger's ranges (:mod:`ingest.changes_check`), and the dead
letters against the records that decode as no change.

The records are decoded as a batch decodes them now. A record the dead-letter table holds is taken
as the dead letter it was when read (a decoding changed since does not make it a change); any
other record the decoding makes no change of must be a dead letter. A change superseded by a later
one of its key, or that deleted its key, leaves no row: unlike an append table's, such offsets are
in neither table, and are judged by the key's row instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields

import pyarrow as pa
import pyarrow.compute as pc

from ingest import records
from ingest.changes import OP
from ingest.changes_check import judge
from ingest.core.coverage import Coverage
from ingest.core.ranges import Range
from ingest.engines.task_spec import TaskSpec
from ingest.ops.verify_reads import expected_reads
from ingest.ops.verify_report import SAMPLE, PartitionCheck, Problem, offsets_by_partition, sample
from ingest.ports import ValueDecoder
from ingest.records import RawChunk

_R, _D = records.ROWS, records.DEAD_LETTERS
_COORDINATES = [_R.topic, _R.partition, _R.offset]


def changelog_checks(
    spec: TaskSpec,
    spans: Sequence[tuple[Range, int]],
    chunks: Iterable[RawChunk],
    rows: pa.Table,
    dead: pa.Table,
    claims: Coverage,
) -> list[PartitionCheck]:
    """Each partition of ``spans`` (the checked range, and the ledger's end) judged: ``chunks`` are
    Kafka's records of the spans, decoded by ``spec``'s decoder, those the ledger history read
    (``claims``: not what a forward reset or a skipped loss passed over) taken as its changes;
    ``rows`` are the table's (the key columns and coordinates), ``dead`` the dead letters'
    coordinates."""
    assert spec.changes is not None
    key = list(spec.changes[1])
    decoder = spec.decoder()
    changes, refused, read = _decoded(decoder, chunks, key)
    refused, read = _read_by_the_ledger(refused, spans, claims), _read_by_the_ledger(read, spans, claims)
    if changes is not None:
        changes = _read_by_the_ledger(changes, spans, claims)
    if changes is None:  # (nothing read)
        changes = rows.select([*key, *_COORDINATES]).slice(0, 0).append_column(OP, pa.array([], pa.string()))
    # (pyiceberg reads strings as large strings: every table takes the decoded changes' types)
    rows = _as(rows.select([*key, *_COORDINATES]), changes)
    stored_dead = _as(dead.select([_D.topic, _D.partition, _D.offset]).rename_columns(_COORDINATES), changes)
    # a record stored as a dead letter is one, whatever the decoding says now
    changes = changes.join(stored_dead, _COORDINATES, join_type="left anti")
    in_range = _in_spans(rows, [span for span, _ in spans])
    found = judge(changes, rows, in_range, key)
    by_partition = {  # (each table's offsets per partition, once)
        name: offsets_by_partition(table, *_COORDINATES)
        for name, table in {
            "read": read,
            "rows": rows.filter(in_range),
            "dead": stored_dead,
            "refused": refused,
            **{kind.name: getattr(found, kind.name) for kind in fields(found)},
        }.items()
    }
    empty = pa.array([], pa.int64())
    checks = []
    for (tp, start, top), end in spans:
        here = {name: offsets.get(tp, empty) for name, offsets in by_partition.items()}
        check = PartitionCheck(tp, start, end, top)
        mine, gone = here["rows"], here["dead"]
        gone = gone.filter(pc.and_(pc.greater_equal(gone, start), pc.less(gone, top))) if len(gone) else gone
        check.in_kafka, check.rows, check.dead_letters = len(here["read"]), len(mine), len(gone)
        problems: dict[Problem, set[int]] = {
            "missing": {*sample(here["missing"])},
            # a row that is not its key's last change's, or whose key that change deleted, or that no change left
            "unexpected": {*sample(here["stale"]), *sample(here["undeleted"]), *sample(here["unexpected"])},
            "duplicated": {*sample(here["duplicated"])},
        }
        owed = here["refused"]
        if len(owed):  # records that are no change: each a dead letter, once, and no row
            problems["missing"] |= {*sample(owed.filter(pc.invert(pc.is_in(owed, gone))))}
        if len(gone):
            counts = pc.value_counts(gone)
            problems["duplicated_dead_letters"] = {
                *sample(counts.field("values").filter(pc.greater(counts.field("counts"), 1)))
            }
            problems["in_both_tables"] = {*sample(gone.filter(pc.is_in(gone, mine)))} if len(mine) else set()
        check.found = {kind: sorted(offsets)[:SAMPLE] for kind, offsets in problems.items() if offsets}
        checks.append(check)
    return checks


def _decoded(
    decoder: ValueDecoder, chunks: Iterable[RawChunk], key: list[str]
) -> tuple[pa.Table | None, pa.Table, pa.Table]:
    """The changes (key columns, coordinates, kind), the coordinates of the records that are no
    change, and of every record read."""
    changes, refused, read = [], [], []
    for chunk in chunks:
        decoded = decoder.decode(chunk)
        changes.append(decoded.rows.select([*key, *_COORDINATES, OP]))
        refused.append(decoded.dead_letters.select([_D.topic, _D.partition, _D.offset]).rename_columns(_COORDINATES))
        read.append(pa.table([chunk.topic, chunk.partition, chunk.offset], names=_COORDINATES))
    empty = pa.schema(_R.fields()[:3]).empty_table()
    if not changes:
        return None, empty, empty
    return (
        pa.concat_tables(changes),
        pa.concat_tables([empty, *refused], promote_options="permissive"),
        pa.concat_tables(read),
    )


def _read_by_the_ledger(table: pa.Table, spans: Sequence[tuple[Range, int]], claims: Coverage) -> pa.Table:
    """The records of ``table`` (coordinates among its columns) that the ledger's moves read."""
    read = pa.array([False] * table.num_rows, pa.bool_())
    for (tp, _, _), end in spans:
        here = pc.and_(pc.equal(table[_R.topic], tp.topic), pc.equal(table[_R.partition], tp.partition))
        read = pc.or_(read, pc.and_(here, pc.greater(expected_reads(table[_R.offset], claims, tp, end), 0)))
    return table.filter(read)


def _as(table: pa.Table, like: pa.Table) -> pa.Table:
    """``table`` with the types ``like`` gives its columns."""
    return table.cast(pa.schema([like.schema.field(name) for name in table.column_names]))


def _in_spans(rows: pa.Table, spans: Sequence[Range]) -> pa.Array:
    inside = pa.array([False] * rows.num_rows)
    for tp, lo, hi in spans:
        here = pc.and_(pc.equal(rows[_R.topic], tp.topic), pc.equal(rows[_R.partition], tp.partition))
        within = pc.and_(pc.greater_equal(rows[_R.offset], lo), pc.less(rows[_R.offset], hi))
        inside = pc.or_(inside, pc.and_(here, within))
    return inside
