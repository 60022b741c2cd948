"""A changelog topic's records decoded into changes (``changes.envelope``).

``upsert`` (:class:`UpsertChanges`): a value is its key's whole row, decoded by the topic's value
decoder, and a tombstone (a null value) deletes the key its Kafka key names (``key_format``).

``debezium``: the value decoder of the topic's format reads each record as the change event it is (its
``before`` and ``after`` images and ``op``; :func:`debezium_fields`), and :class:`DebeziumChanges`
makes changes of the events (:func:`ingest.changes.from_debezium`). With JSON, the event is read at
the top level (the JSON converter's ``schemas.enable=false``) or under ``payload`` beside its
``schema`` (``true``), either in the same topic. With a registry format (Avro, Protobuf, JSON
Schema), the writer schema is the event's, and its ``after`` record is the row
(:func:`debezium_row`): the table's columns are that record's fields, and evolve with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from ingest.changes import AFTER, BEFORE, DEBEZIUM_OP, from_debezium, from_tombstones, from_upserts
from ingest.formats.keys import KeyDecoder, value_fields
from ingest.formats.rows import assemble, dead_letters, together
from ingest.formats.wire import Refused, RowOf
from ingest.ports import ValueDecoder
from ingest.records import ROWS, Declared, Decoded, Field, RawChunk, rows_schema
from ingest.type_names import arrow_type, type_name

#: where the JSON converter puts the event when it sends its schema too (``schemas.enable=true``)
PAYLOAD = "payload"


def _struct(fields: Sequence[Declared]) -> str:
    return f"struct<{', '.join(f'{f.name}: {f.type}' for f in fields)}>"


def debezium_fields(row: Sequence[Declared], *, wrapped: bool) -> list[Field]:
    """The fields a decoder reads a Debezium change event with, whose images are rows of ``row``:
    ``before``, ``after`` and ``op``, and (``wrapped``: JSON, whose converter may send the schema
    with the event) the same under ``payload``. The event's other fields (``source``, ``ts_ms``,
    ``transaction``, the converter's ``schema``) are not read."""
    event = [Field(BEFORE, _struct(row)), Field(AFTER, _struct(row)), Field(DEBEZIUM_OP, "string")]
    return [*event, Field(PAYLOAD, _struct(event))] if wrapped else event


def debezium_row(event: Sequence[Declared]) -> list[Field]:
    """The row fields of a Debezium change event's fields (a registry writer schema's, or
    :func:`debezium_fields`'): its ``after`` record's, each optional (raises
    :class:`~ingest.formats.wire.Refused` if the event has no ``after`` record or no ``op``)."""
    fields = {f.name: f for f in event}
    if DEBEZIUM_OP not in fields or AFTER not in fields:
        lacking = " and ".join(repr(n) for n in (AFTER, DEBEZIUM_OP) if n not in fields)
        raise Refused(
            f"it has no {lacking} field: it is not a Debezium change event (changes.envelope: debezium expects "
            "before, after, op and source)"
        )
    image = arrow_type(fields[AFTER].type)
    if not pa.types.is_struct(image):
        raise Refused(f"its {AFTER!r} field is a {fields[AFTER].type}, not a record of the row's columns")
    return [Field(f.name, type_name(f.type)) for f in image]


def row_of(envelope: str | None) -> RowOf | None:
    """How a value's fields give its row's under ``changes.envelope``: a Debezium event's are its
    ``after`` record's (:func:`debezium_row`); None: a value is its row."""
    return debezium_row if envelope == "debezium" else None


def _unwrapped(events: pa.Table) -> pa.Table:
    """Events read with :func:`debezium_fields`, each from where its value had it: under
    ``payload`` if it was there, else at the top level."""
    if PAYLOAD not in events.column_names:
        return events
    payload = events[PAYLOAD].combine_chunks()
    wrapped = pc.is_valid(payload)
    for name in (BEFORE, AFTER, DEBEZIUM_OP):
        at = events.schema.get_field_index(name)
        top = events[name].combine_chunks()
        events = events.set_column(at, name, pc.if_else(wrapped, pc.struct_field(payload, name), top))
    return events.drop_columns([PAYLOAD])


class DebeziumChanges:
    """A :class:`~ingest.ports.ValueDecoder` of Debezium change events into changes of the rows of
    key ``key`` (the columns :func:`ingest.changes.from_debezium` makes; :data:`ingest.changes.OP`
    says which). ``events`` decodes the values into their ``before``, ``after`` and ``op`` (and,
    with JSON, ``payload``: :func:`debezium_fields`).

    The tombstone Debezium sends after a delete (a null value, for Kafka's log compaction) is read
    and skipped: the delete event before it said all. A record that is no change of a keyed row
    (``t``, an unknown ``op``, an image missing, a null key column) is a dead letter saying why,
    as is a value the events decoder refuses. The event's own fields are not the table's columns,
    so a record is not counted for having them (``unknown``)."""

    def __init__(self, events: ValueDecoder, key: Sequence[str]) -> None:
        self.events = events
        self.key = tuple(key)

    def decode(self, chunk: RawChunk) -> Decoded:
        present = [i for i, value in enumerate(chunk.values) if value is not None]
        read = chunk if len(present) == len(chunk) else chunk.take(present)
        decoded = self.events.decode(read)
        changes, why = from_debezium(_unwrapped(decoded.rows), self.key)
        if not why:
            return Decoded(changes, decoded.dead_letters)
        return Decoded(changes, together(decoded.dead_letters, _refused(read, decoded.rows, why)))


class UpsertChanges:
    """A :class:`~ingest.ports.ValueDecoder` of an upsert topic's records into changes of the rows of
    key ``key`` (:data:`ingest.changes.OP` says which): ``values`` decodes the values into rows of
    the table's ``fields`` (with ``key_format``, the decoded key beside them), each an upsert of
    its row; a tombstone (a null value) deletes the row its Kafka key names, decoded by ``keys``. A
    row with a null key column, or a tombstone whose key names no row, is a dead letter saying why."""

    def __init__(self, values: ValueDecoder, keys: KeyDecoder, key: Sequence[str], fields: Sequence[Declared]) -> None:
        self.values = values
        self.keys = keys
        self.key = tuple(key)
        self._row = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in value_fields(fields)])

    def decode(self, chunk: RawChunk) -> Decoded:
        values = [i for i, value in enumerate(chunk.values) if value is not None]
        if len(values) == len(chunk):
            return self._upserts(chunk)
        upserts = self._upserts(chunk.take(values))
        deletes = self._deletes(chunk.take([i for i, value in enumerate(chunk.values) if value is None]))
        # the deletes as the upserts' columns (a delete has no key column null: its record is a dead letter)
        schema = upserts.rows.schema
        rows = pa.concat_tables([upserts.rows, deletes.rows.select(schema.names).cast(schema)])
        return Decoded(rows, together(upserts.dead_letters, deletes.dead_letters))

    def _upserts(self, chunk: RawChunk) -> Decoded:
        decoded = self.values.decode(chunk)
        rows, why = from_upserts(decoded.rows, self.key)
        # every column nullable, with tombstones in the chunk or not: a delete's other columns are null,
        # even where the table requires a value (its row is never written: the fold takes its key alone)
        rows = rows.cast(pa.schema([f.with_nullable(True) for f in rows.schema]))
        return Decoded(rows, together(decoded.dead_letters, _refused(chunk, decoded.rows, why)), decoded.unknown)

    def _deletes(self, tombstones: RawChunk) -> Decoded:
        keys, unread = self.keys.decode(tombstones)
        read = [i for i in range(len(tombstones)) if i not in unread]
        named = replace(tombstones, decoded_key=keys).take(read)
        assert named.decoded_key is not None
        others = assemble(named, None, pa.table({}), rows_schema([]))
        deletes, why = from_tombstones(others, named.decoded_key, self.key, self._row)
        return Decoded(deletes, together(dead_letters(tombstones, unread), dead_letters(named, why)))


def _refused(read: RawChunk, rows: pa.Table, why: dict[int, str]) -> pa.Table:
    """The records of ``read`` whose rows (at ``why``'s positions in ``rows``) are no change, as dead
    letters saying why."""
    at = {record: i for i, record in enumerate(_coordinates(read.topic, read.partition, read.offset))}
    if not why:
        return dead_letters(read, {})
    decoded = _coordinates(rows[ROWS.topic], rows[ROWS.partition], rows[ROWS.offset])
    return dead_letters(read, {at[decoded[i]]: reason for i, reason in why.items()})


def _coordinates(*columns: pa.Array | pa.ChunkedArray) -> list[tuple[object, ...]]:
    return list(zip(*(column.to_pylist() for column in columns), strict=True))
