"""A changelog batch folded into what its commit does (``changes:`` in a pipeline's config).

A changelog topic's records are changes to rows, each naming its row by a key (one or more
columns, the table's identifier fields): an upsert carries the row's new image, a delete only its
key. A batch's changes, decoded, are one Arrow table: the key columns, the row's other columns (null
for a delete), the record's Kafka coordinates and :data:`OP`. Folding them gives the commit's row
delta: every key the batch touches has its live row deleted, and each key whose last change (in
offset order of its partition) is an upsert gets that change's row. So a table committed batch by
batch holds, for every key, the image of its newest committed change, or no row if that deleted it.

A Debezium change event (``changes.envelope: debezium``) becomes changes by :func:`from_debezium`.

A key is expected to stay in one partition (Debezium and keyed producers put a key's changes in
one); if a batch meets a key in several, the change of the highest partition, then offset, wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from ingest.records import ROWS

#: the column a decoded change carries its kind in (dropped before its row is written)
OP = "_ingest_change"
#: the values of :data:`OP`
UPSERT, DELETE = "upsert", "delete"

_INDEX, _ORDER = "__ingest_index", "__ingest_order"


@dataclass(frozen=True)
class KeyDeletes:
    """The rows a changelog batch's commit deletes: the live rows of ``keys`` (columns ``key``)."""

    key: tuple[str, ...]
    keys: pa.Table


@dataclass(frozen=True)
class Folded:
    """What a batch's changes commit."""

    #: the positions (in the changes) of the rows that land: per key, its last change if an upsert
    rows: pa.Array
    #: every key the changes touch, once: the live rows the commit deletes first
    keys: pa.Table


def fold(changes: pa.Table, key: Sequence[str]) -> Folded:
    """Fold ``changes`` (key columns ``key``, :data:`OP`, the Kafka partition and offset; no null
    key: such a record is a dead letter before it gets here) into what their commit does."""
    names = list(key)
    if not changes.num_rows:
        return Folded(pa.array([], pa.int64()), changes.select(names))
    index = pa.array(range(changes.num_rows), pa.int64())
    narrow = changes.select([*names, OP, ROWS.partition, ROWS.offset]).append_column(_INDEX, index)
    ordered = narrow.sort_by([(ROWS.partition, "ascending"), (ROWS.offset, "ascending"), (_INDEX, "ascending")])
    ordered = ordered.append_column(_ORDER, index)
    last = ordered.group_by(names, use_threads=False).aggregate([(_ORDER, "max")])
    newest = ordered.take(last[f"{_ORDER}_max"])
    landing = newest.filter(pc.equal(newest[OP], UPSERT))[_INDEX]
    return Folded(landing.take(pc.sort_indices(landing)).combine_chunks(), last.select(names))


#: Debezium's ``op`` of a row written: created, read by a snapshot, updated
DEBEZIUM_UPSERTS = ("c", "r", "u")
DEBEZIUM_DELETE = "d"
#: the fields of a Debezium change event the changes are made of (the rest, ``source``, ``ts_ms``
#: and ``transaction``, describe where it came from)
BEFORE, AFTER, DEBEZIUM_OP = "before", "after", "op"


def from_debezium(events: pa.Table, key: Sequence[str]) -> tuple[pa.Table, dict[int, str]]:
    """Decoded Debezium change events (their ``before``, ``after`` and ``op``, beside the other
    columns of a decoded record: the Kafka coordinates and the like) as changes: ``c``, ``r`` and
    ``u`` upsert the ``after`` image, ``d`` deletes the ``before`` image's key, and an update that
    changes the key also deletes the old one. Returns the changes (the other columns, the image's
    columns, :data:`OP`) and, by position in ``events``, the events that are none, with why."""
    op = events[DEBEZIUM_OP].combine_chunks()
    before, after = events[BEFORE].combine_chunks(), events[AFTER].combine_chunks()
    upsert = pc.fill_null(pc.is_in(op, pa.array(DEBEZIUM_UPSERTS)), False)
    delete = pc.fill_null(pc.equal(op, DEBEZIUM_DELETE), False)
    why = {
        i: f"Debezium op {value!r} is not a change of a row (c, r, u, d)"
        for i, value in enumerate(op.to_pylist())
        if value not in (*DEBEZIUM_UPSERTS, DEBEZIUM_DELETE)
    }
    for image, name, wanted in ((after, AFTER, upsert), (before, BEFORE, delete)):
        missing = pc.and_(wanted, pc.is_null(image))
        for i in pc.indices_nonzero(missing).to_pylist():
            why.setdefault(i, f"Debezium op {op[i].as_py()!r} without the {name!r} image")
        for column in key:
            unkeyed = pc.and_(pc.and_(wanted, pc.is_valid(image)), pc.is_null(pc.struct_field(image, column)))
            for i in pc.indices_nonzero(unkeyed).to_pylist():
                why.setdefault(i, f"key column {column!r} is null in the {name!r} image")
    good = _all_but(len(op), why)
    others = events.drop_columns([BEFORE, AFTER, DEBEZIUM_OP])
    # an update whose key changed also deletes the old key (before the new one: one offset, two keys)
    moved = pc.and_(pc.and_(upsert, pc.is_valid(before)), _keys_differ(before, after, key))
    parts = [
        _images(others, before, pc.and_(good, pc.or_(delete, moved)), DELETE, after.type, key),
        _images(others, after, pc.and_(good, upsert), UPSERT, after.type, key),
    ]
    return pa.concat_tables(parts), why


def _keys_differ(before: pa.StructArray, after: pa.StructArray, key: Sequence[str]) -> pa.Array:
    differs = [pc.not_equal(pc.struct_field(before, c), pc.struct_field(after, c)) for c in key]
    return pc.fill_null(reduce(pc.or_, differs), False)


def _images(
    others: pa.Table, image: pa.StructArray, where: pa.Array, op: str, row: pa.StructType, key: Sequence[str]
) -> pa.Table:
    """The rows at ``where`` as changes ``op``: ``others`` beside the image's columns (of ``row``'s
    fields; a delete keeps only its key), and :data:`OP`."""
    picked = others.filter(where)
    chosen = image.filter(where)
    for field in row:
        column = pc.struct_field(chosen, field.name) if op == UPSERT or field.name in key else None
        picked = picked.append_column(field, column if column is not None else pa.nulls(len(chosen), field.type))
    return picked.append_column(OP, _ops(op, len(chosen)))


def from_upserts(rows: pa.Table, key: Sequence[str]) -> tuple[pa.Table, dict[int, str]]:
    """Decoded records of an upsert topic (``changes.envelope: upsert``: a value is its key's whole
    row) as upserts; by position, the records that are none (a null key column), with why."""
    why: dict[int, str] = {}
    for column in key:
        for i in pc.indices_nonzero(pc.is_null(rows[column])).to_pylist():
            why.setdefault(i, f"key column {column!r} is null")
    good = _all_but(rows.num_rows, why)
    kept = rows.filter(good)
    return kept.append_column(OP, _ops(UPSERT, kept.num_rows)), why


def from_tombstones(
    others: pa.Table, keys: pa.Array, key: Sequence[str], row: pa.Schema
) -> tuple[pa.Table, dict[int, str]]:
    """Tombstones of an upsert topic (null values) as deletes of their Kafka key (``keys``, decoded
    with ``key_format``): a string names the one key column (its value, as that column's type), a
    structured key the key columns by field name. ``others``: the records' other columns (the Kafka
    coordinates); ``row``: the rows' columns. By position, the tombstones that delete no key, with why."""
    why: dict[int, str] = {}
    columns: dict[str, pa.Array] = {}
    if pa.types.is_struct(keys.type):
        names = {keys.type.field(i).name for i in range(keys.type.num_fields)}
        lacking = [c for c in key if c not in names]
        if lacking:
            return _none_of(others, row), dict.fromkeys(range(len(keys)), f"the key has no field {lacking[0]!r}")
        columns = {c: pc.struct_field(keys, c).cast(row.field(c).type) for c in key}
    elif len(key) == 1:
        columns = {key[0]: _cast_each(keys, row.field(key[0]).type, key[0], why)}
    else:
        reason = f"a {keys.type} key cannot name the {len(key)} key columns {list(key)}: use a structured key"
        return _none_of(others, row), dict.fromkeys(range(len(keys)), reason)
    for column, values in columns.items():
        for i in pc.indices_nonzero(pc.is_null(values)).to_pylist():
            why.setdefault(i, f"a tombstone whose key gives no {column!r}")
    good = _all_but(len(keys), why)
    deletes = others.filter(good)
    n = deletes.num_rows
    for field in row:
        values = columns[field.name].filter(good) if field.name in columns else pa.nulls(n, field.type)
        deletes = deletes.append_column(field, values)
    return deletes.append_column(OP, _ops(DELETE, n)), why


def _cast_each(keys: pa.Array, kind: pa.DataType, column: str, why: dict[int, str]) -> pa.Array:
    """``keys`` as ``kind`` (a string key of a numeric key column, say); a key that is none is null,
    and ``why`` says so at its position."""
    try:
        return keys.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    values: list[object] = []
    for i, value in enumerate(keys.to_pylist()):
        try:
            values.append(pa.array([value]).cast(kind)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values.append(None)
            why[i] = f"the key {value!r} is no value of key column {column!r} ({kind})"
    return pa.array(values, kind)


def _none_of(others: pa.Table, row: pa.Schema) -> pa.Table:
    """No change: ``others``' columns and ``row``'s, and :data:`OP`, with no row."""
    empty = others.slice(0, 0)
    for field in row:
        empty = empty.append_column(field, pa.nulls(0, field.type))
    return empty.append_column(OP, _ops(UPSERT, 0))


def _all_but(n: int, why: dict[int, str]) -> pa.Array:
    """Which of ``n`` records are changes: those ``why`` does not name."""
    return pc.invert(pc.is_in(pa.array(range(n), pa.int64()), pa.array(sorted(why), pa.int64())))


def _ops(op: str, n: int) -> pa.Array:
    """:data:`OP`'s column of ``n`` changes ``op``."""
    return pa.array([op] * n, pa.string())
