"""A Debezium topic's values decoded into changes (``changes.envelope: debezium``).

The value decoder of the topic's format reads each record as the change event it is (its
``before`` and ``after`` images, ``op``, and what Debezium says of its source), and
:class:`DebeziumChanges` makes changes of the events (:func:`ingest.changes.from_debezium`). With
JSON, :func:`debezium_fields` are the fields the decoder reads: the event at the top level (the
JSON converter's ``schemas.enable=false``) or under ``payload`` beside its ``schema`` (``true``),
either in the same topic.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ingest.changes import AFTER, BEFORE, DEBEZIUM_OP, from_debezium
from ingest.formats.rows import dead_letters, together
from ingest.ports import ValueDecoder
from ingest.records import ROWS, Declared, Decoded, Field, RawChunk

#: where the JSON converter puts the event when it sends its schema too (``schemas.enable=true``)
PAYLOAD = "payload"


def _struct(fields: Sequence[Declared]) -> str:
    return f"struct<{', '.join(f'{f.name}: {f.type}' for f in fields)}>"


def debezium_fields(row: Sequence[Declared]) -> list[Field]:
    """The fields a JSON decoder reads a Debezium change event with, whose images are rows of
    ``row``: ``before``, ``after`` and ``op``, and the same under ``payload``. The event's other
    fields (``source``, ``ts_ms``, ``transaction``, the converter's ``schema``) are not read."""
    event = [Field(BEFORE, _struct(row)), Field(AFTER, _struct(row)), Field(DEBEZIUM_OP, "string")]
    return [*event, Field(PAYLOAD, _struct(event))]


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
        at = {record: i for i, record in enumerate(_coordinates(read.topic, read.partition, read.offset))}
        rows = decoded.rows
        events = _coordinates(rows[ROWS.topic], rows[ROWS.partition], rows[ROWS.offset])
        refused = dead_letters(read, {at[events[i]]: reason for i, reason in why.items()})
        return Decoded(changes, together(decoded.dead_letters, refused))


def _coordinates(*columns: pa.Array | pa.ChunkedArray) -> list[tuple[object, ...]]:
    return list(zip(*(column.to_pylist() for column in columns), strict=True))
