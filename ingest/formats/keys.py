"""Record keys decoded into the column ``_kafka_key_decoded`` (``key_format:`` on the topics), beside
the raw ``_kafka_key``.

To the table the key column is one more optional field: ``string`` keys are a string column; a
Protobuf or JSON Schema key is a ``struct<…>`` of its message's (object's) fields, and an Avro key
is the column of its schema's type: a record's ``struct<…>``, or a primitive's type
(``"string"``, ``"long"``). It evolves as value
fields do, in the batch's own snapshot: a newer key writer schema makes the batch be produced
again (:class:`ingest.errors.SchemaAhead` with ``key=True``). A null key reads as null; a key that
does not decode makes its record a dead letter whose reason starts with ``key``.

:class:`KeyedDecoder` decodes the keys first, then the values of the records whose keys decoded,
with whichever value decoder the topics' ``format`` has; the value decoders put the decoded keys
beside the coordinates (:func:`ingest.formats.rows.assemble`), and the columns are put in the
table's order here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np
import pyarrow as pa

from ingest.changes import OP
from ingest.errors import KEYS_AHEAD, SchemaAhead, SchemaChangeRefused, firsts_text
from ingest.format_names import OnSchemaChange
from ingest.formats.rows import dead_letters
from ingest.formats.wire import RegistryDecoder
from ingest.ports import SchemaRegistry, ValueDecoder, WriterSchema
from ingest.records import KEY_COLUMN, ROWS, Declared, Decoded, Field, RawChunk, rows_schema
from ingest.type_names import arrow_type, type_name

#: the one field of the record an Avro key schema is read as (:func:`wrapped`)
_VALUE = "value"


class KeyDecoder(Protocol):
    def decode(self, chunk: RawChunk) -> tuple[pa.Array, dict[int, str]]:
        """The chunk's keys decoded (null where the key is null or does not decode), and why each
        key that does not decode does not, by position."""
        ...


class StringKeys:
    """UTF-8 keys as strings."""

    def decode(self, chunk: RawChunk) -> tuple[pa.Array, dict[int, str]]:
        try:
            return chunk.key.cast(pa.string()), {}
        except pa.ArrowInvalid:  # some key is not UTF-8: find which, one at a time
            pass
        keys: list[str | None] = []
        bad: dict[int, str] = {}
        for i, key in enumerate(chunk.key.to_pylist()):
            try:
                keys.append(None if key is None else key.decode())
            except UnicodeDecodeError as error:
                keys.append(None)
                bad[i] = f"key: not UTF-8 text ({error}), and key_format is string"
        return pa.array(keys, pa.string()), bad


def wrapped(writer: WriterSchema) -> WriterSchema:
    """An Avro key schema as a record of one field, ``value``, of it: the same bytes (a record's
    encoding is its fields'), and one shape for every key schema (a record, a union with null, a
    primitive, a named type of a referenced subject)."""
    if writer.kind != "AVRO":
        return writer
    try:
        schema = json.loads(writer.text)
    except ValueError:
        return writer  # the format says what is wrong with it
    record = {"type": "record", "name": "__key", "fields": [{"name": _VALUE, "type": schema}]}
    return WriterSchema(writer.schema_id, writer.kind, json.dumps(record), writer.references)


def key_column(writer: WriterSchema, fields: Sequence[Field]) -> Field:
    """The key column of a key writer schema whose :func:`wrapped` form maps to ``fields``."""
    if writer.kind == "AVRO":
        return Field(KEY_COLUMN, fields[0].type, False)
    return Field(KEY_COLUMN, "struct<" + ", ".join(f"{f.name}: {f.type}" for f in fields) + ">", False)


class _Wrapped:
    """A registry whose Avro schemas read as records of one field (:func:`wrapped`)."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def by_id(self, schema_id: int) -> WriterSchema | None:
        writer = self.registry.by_id(schema_id)
        return None if writer is None else wrapped(writer)

    def latest(self, subject: str) -> WriterSchema:
        return wrapped(self.registry.latest(subject))


class RegistryKeys:
    """Keys in the Confluent wire format, read by the format's registry decoder (``decoder``, with
    ``on_change`` as for values) into the key column's fields."""

    def __init__(
        self, key: Declared, registry: SchemaRegistry, decoder: type[RegistryDecoder], on_change: OnSchemaChange
    ) -> None:
        self.type = arrow_type(key.type)
        #: Avro keys are read wrapped (:func:`wrapped`): the column is the wrapper's one field
        self.wrapped = decoder.format.registry_kind == "AVRO"
        children = [pa.field(_VALUE, self.type)] if self.wrapped else list(self.type)
        fields = [Field(f.name, type_name(f.type), False) for f in children]
        self.decoder = decoder(fields, _Wrapped(registry), on_change)
        self.decoder.part = "key"

    def decode(self, chunk: RawChunk) -> tuple[pa.Array, dict[int, str]]:
        n = len(chunk)
        present = np.flatnonzero(chunk.key.is_valid().to_numpy(zero_copy_only=False))
        keys = RawChunk(
            chunk.topic.take(present),
            chunk.partition.take(present),
            pa.array(present, pa.int64()),  # the rows and dead letters say where each key was
            chunk.timestamp.take(present),
            pa.nulls(len(present), pa.binary()),
            chunk.key.take(present).to_pylist(),
            lambda i: None,
            0,
        )
        try:
            decoded = self.decoder.decode(keys)
        except SchemaAhead as ahead:  # its offsets are positions in ``chunk``: where the records are
            offsets = chunk.offset.to_pylist()
            first = tuple((topic, partition, offsets[position]) for topic, partition, position in ahead.first)
            message = str(ahead).replace(firsts_text(ahead.first), firsts_text(first))
            raise SchemaAhead(f"{KEYS_AHEAD}{message}", ahead.schema_ids, key=True, first=first) from None
        except SchemaChangeRefused as refused:
            raise SchemaChangeRefused(f"{KEYS_AHEAD}{refused}") from None
        rows = decoded.rows.sort_by(ROWS.offset)
        if self.wrapped:
            column = rows.column(_VALUE).combine_chunks()
        else:
            names = [f.name for f in self.type]
            column = pa.StructArray.from_arrays([rows.column(f).combine_chunks() for f in names], names=names)
        where = np.full(n, -1, np.int64)
        where[rows.column(ROWS.offset).to_numpy()] = np.arange(rows.num_rows)
        keys_decoded = column.take(pa.array(where, mask=where < 0)).cast(self.type)
        dead = decoded.dead_letters
        bad = {
            int(position): error if error.startswith("key ") else f"key: {error}"
            for position, error in zip(dead.column("offset").to_pylist(), dead.column("error").to_pylist(), strict=True)
        }
        return keys_decoded, bad


class KeyedDecoder:
    """Keys decoded by ``keys``, then the values of the records whose keys decoded by ``values``
    (built for the table's fields but the key column's), into rows of the table's ``fields``."""

    def __init__(self, fields: Sequence[Declared], values: ValueDecoder, keys: KeyDecoder) -> None:
        self.values = values
        self.keys = keys
        self._names = rows_schema(fields).names

    def decode(self, chunk: RawChunk) -> Decoded:
        keys, bad = self.keys.decode(chunk)
        chunk = replace(chunk, decoded_key=keys)
        kept = chunk if not bad else chunk.take([i for i in range(len(chunk)) if i not in bad])
        decoded = self.values.decode(kept)
        # (changes: their kind too, :data:`ingest.changes.OP`)
        rows = decoded.rows.select([*self._names, *([OP] if OP in decoded.rows.column_names else [])])
        if not bad:
            return Decoded(rows, decoded.dead_letters, decoded.unknown)
        return Decoded(rows, pa.concat_tables([dead_letters(chunk, bad), decoded.dead_letters]), decoded.unknown)


def value_fields(fields: Sequence[Declared]) -> list[Declared]:
    """The table's fields the values are decoded into: all but the key column."""
    return [f for f in fields if f.name != KEY_COLUMN]
