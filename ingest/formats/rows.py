"""What every decoder does with a chunk once its values are decoded: rows beside their Kafka
coordinates, and poison records as dead letters naming the cause."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.ports import ValueDecoder
from ingest.records import (
    DEAD_LETTER_SCHEMA,
    DEAD_LETTERS,
    HEADERS_COLUMN,
    HEADERS_TYPE,
    KAFKA_COLUMNS,
    KEY_COLUMN,
    ROWS,
    Declared,
    Decoded,
    RawChunk,
    rows_schema,
)
from ingest.type_names import arrow_type


def assemble(chunk: RawChunk, good: Sequence[int] | None, fields: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of ``schema``: the coordinates of the records at ``good`` (all, if None), beside ``fields``
    (their decoded values, in that order)."""
    kafka = [chunk.topic, chunk.partition, chunk.offset, chunk.timestamp, chunk.key]
    if chunk.decoded_key is not None:  # after the coordinates; the keyed decoder puts it in the table's place
        kafka.append(chunk.decoded_key)
        schema = schema.insert(len(kafka) - 1, pa.field(KEY_COLUMN, chunk.decoded_key.type))
    if chunk.header_map is not None:  # after them too; WithHeaders puts it in the table's place
        kafka.append(chunk.header_map)
        schema = schema.insert(len(kafka) - 1, pa.field(HEADERS_COLUMN, chunk.header_map.type))
    if good is not None:
        take = pa.array(good, type=pa.int64())
        kafka = [column.take(take) for column in kafka]
    return pa.Table.from_arrays([*kafka, *fields.columns], schema=schema)


def dead_letters(chunk: RawChunk, bad: Mapping[int, str]) -> pa.Table:
    """The records at ``bad``'s positions as dead letters, each with its reason."""
    order = sorted(bad)
    take = pa.array(order, type=pa.int64())
    raw = [chunk.headers(i) for i in order]
    headers_type = DEAD_LETTER_SCHEMA.field("headers").type
    if any(raw):
        headers = pa.array([[{"key": k, "value": v} for k, v in h] if h else [] for h in raw], type=headers_type)
    else:  # the usual case: no record has headers, each an empty list
        empty = pa.array([], type=headers_type.value_type)
        headers = pa.ListArray.from_arrays(np.zeros(len(order) + 1, np.int32), empty, type=headers_type)
    columns = [
        chunk.topic.take(take),
        chunk.partition.take(take),
        chunk.offset.take(take),
        chunk.timestamp.take(take),
        chunk.key.take(take),
        pa.array([chunk.values[i] for i in order], type=pa.binary()),
        headers,
        pa.array([bad[i] for i in order], type=pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=DEAD_LETTER_SCHEMA)


def together(*dead: pa.Table) -> pa.Table:
    """Dead letters of one chunk set aside at different steps, in the order of their records."""
    c = DEAD_LETTERS
    return pa.concat_tables(dead).sort_by([(c.topic, "ascending"), (c.partition, "ascending"), (c.offset, "ascending")])


class WithHeaders:
    """Each record's Kafka headers as the map column ``_kafka_headers`` (``headers: true``) of the
    rows ``decoder`` makes of the table's ``fields``: every key once, with its last value (as
    Kafka clients' ``lastHeader`` reads them; the dead letters keep every header as it came)."""

    def __init__(self, decoder: ValueDecoder, fields: Sequence[Declared]) -> None:
        self.decoder = decoder
        self._names = rows_schema(fields).names
        self._type = arrow_type(HEADERS_TYPE)

    def decode(self, chunk: RawChunk) -> Decoded:
        maps = []
        for i in range(len(chunk)):
            raw = chunk.headers(i)
            maps.append(list(dict(raw).items()) if raw else [])
        decoded = self.decoder.decode(replace(chunk, header_map=pa.array(maps, type=self._type)))
        return Decoded(decoded.rows.select(self._names), decoded.dead_letters, decoded.unknown)


class SizeLimited:
    """Values longer than ``max_bytes`` (``dead_letters.max_value_bytes``) as dead letters saying
    so; the others decoded by ``decoder``, whatever the format."""

    def __init__(self, decoder: ValueDecoder, max_bytes: int) -> None:
        self.decoder = decoder
        self.max_bytes = max_bytes

    def decode(self, chunk: RawChunk) -> Decoded:
        limit = self.max_bytes
        values = chunk.values
        if all(values):  # no tombstone: len() of each, in C
            sizes = np.fromiter(map(len, cast("list[bytes]", values)), np.int64, len(values))
        else:
            sizes = np.fromiter((len(v or b"") for v in values), np.int64, len(values))
        over = np.flatnonzero(sizes > limit)
        if not over.size:
            return self.decoder.decode(chunk)
        reasons = {
            i: f"value is {size:,} bytes, over dead_letters.max_value_bytes ({limit:,}); raise it to take such records"
            for i, size in zip(over.tolist(), sizes[over].tolist(), strict=True)
        }
        decoded = self.decoder.decode(chunk.take(np.flatnonzero(sizes <= limit).tolist()))
        return Decoded(decoded.rows, together(dead_letters(chunk, reasons), decoded.dead_letters), decoded.unknown)


class NotFinite:
    """Rows with NaN or ±Infinity in a float or double column as dead letters saying which
    (``refuse: [nan]``); the others as ``decoder`` decodes them, whatever the format."""

    def __init__(self, decoder: ValueDecoder) -> None:
        self.decoder = decoder

    def decode(self, chunk: RawChunk) -> Decoded:
        decoded = self.decoder.decode(chunk)
        rows = decoded.rows
        floats = [f.name for f in rows.schema if pa.types.is_floating(f.type) and f.name not in KAFKA_COLUMNS.names]
        found = {}  # row → the first such column
        for name in reversed(floats):
            column = rows.column(name)
            mask = pc.fill_null(pc.or_(pc.is_nan(column), pc.is_inf(column)), False)
            for row in np.flatnonzero(mask.to_numpy(zero_copy_only=False)):
                found[int(row)] = name
        if not found:
            return decoded
        where = {
            coordinates: i
            for i, coordinates in enumerate(
                zip(chunk.topic.to_pylist(), chunk.partition.to_pylist(), chunk.offset.to_pylist(), strict=True)
            )
        }
        at = list(
            zip(
                rows.column(ROWS.topic).to_pylist(),
                rows.column(ROWS.partition).to_pylist(),
                rows.column(ROWS.offset).to_pylist(),
                strict=True,
            )
        )
        bad = {
            where[at[row]]: f"field {name!r}: {rows.column(name)[row].as_py()} is not a finite number (refuse: nan)"
            for row, name in found.items()
        }
        kept = rows.filter(pa.array([row not in found for row in range(rows.num_rows)]))
        return Decoded(kept, together(decoded.dead_letters, dead_letters(chunk, bad)), decoded.unknown)
