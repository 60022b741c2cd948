"""Vectorised decoding of Kafka JSON values into Arrow, with poison records split off.

The fast path parses a whole chunk of values with Arrow's JSON reader against the declared
schema. When a chunk holds bad records the reader rejects the whole block, so the chunk is
bisected until each bad record stands alone; it then goes to the dead letters with a message
that says what is wrong. Good chunks (the usual case) are parsed once, in C++.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ingest.config import FieldSpec

Headers = list[tuple[str, bytes | None]] | None

#: below this many records a failing slice is parsed one record at a time
_SINGLES = 16
_ARROW_COLUMN = re.compile(r"Column\(/(?P<col>[^)]*)\) changed from (?P<want>\w+) to (?P<got>\w+)")
_ARROW_CONVERT = re.compile(r"Failed to convert JSON to (?P<want>[^:,]+)(?:, couldn't parse:|: )(?P<got>.*)")

KAFKA_COLUMNS = pa.schema(
    [
        pa.field("_kafka_topic", pa.string(), nullable=False),
        pa.field("_kafka_partition", pa.int32(), nullable=False),
        pa.field("_kafka_offset", pa.int64(), nullable=False),
        pa.field("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("_kafka_key", pa.binary()),
    ]
)

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]),
                    nullable=False,
                )
            ),
        ),
        pa.field("error", pa.string(), nullable=False),
    ]
)


def arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type a declared Iceberg type name is stored as."""
    if type_name.startswith("decimal("):
        precision, scale = (int(x) for x in type_name[len("decimal(") : -1].split(","))
        return pa.decimal128(precision, scale)
    return {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "string": pa.string(),
    }[type_name]


def _json_type(type_name: str) -> pa.DataType:
    """What Arrow's JSON reader parses the field as, before the final cast."""
    if type_name == "date":
        return pa.string()
    if type_name == "float":
        return pa.float64()
    return arrow_type(type_name)


def table_schema(fields: Sequence[FieldSpec]) -> pa.Schema:
    """Arrow schema of table rows: the fixed Kafka columns, then the declared fields."""
    declared = [pa.field(f.name, arrow_type(f.type), nullable=not f.required) for f in fields]
    return pa.schema([*KAFKA_COLUMNS, *declared])


@dataclass
class RawChunk:
    """Records as read from Kafka, column-wise. ``headers(i)`` is only called for dead letters."""

    topic: pa.Array
    partition: pa.Array
    offset: pa.Array
    timestamp: pa.Array
    key: pa.Array
    values: list[bytes | None]
    headers: Callable[[int], Headers]
    nbytes: int

    def __len__(self) -> int:
        return len(self.values)


@dataclass
class Decoded:
    rows: pa.Table
    dead_letters: pa.Table


class _Bad(Exception):
    pass


class Decoder:
    """Decodes :class:`RawChunk` values against the declared fields."""

    def __init__(self, fields: Sequence[FieldSpec]) -> None:
        self.fields = list(fields)
        self._parse_schema = pa.schema([pa.field(f.name, _json_type(f.type)) for f in fields])
        self._options = pj.ParseOptions(explicit_schema=self._parse_schema, unexpected_field_behavior="ignore")
        self._schema = table_schema(fields)
        self._field_schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in fields])

    def decode(self, chunk: RawChunk) -> Decoded:
        values = list(chunk.values)
        bad: dict[int, str] = {}
        candidates: list[int] = []
        for i, value in enumerate(values):
            if value is None:
                bad[i] = "value is null (a tombstone); expected a JSON object"
            elif not value.strip():
                bad[i] = "value is empty; expected a JSON object"
            else:
                candidates.append(i)
        self._normalise_line_breaks(values, candidates, bad)
        candidates = [i for i in candidates if i not in bad]
        parts: list[tuple[list[int], pa.Table]] = []
        self._parse(values, candidates, parts, bad)
        good = [i for indices, _ in parts for i in indices]
        fields = pa.concat_tables([t for _, t in parts]).combine_chunks() if parts else self._field_schema.empty_table()
        rows = self._assemble(chunk, good, fields)
        return Decoded(rows=rows, dead_letters=self._dead_letters(chunk, bad))

    def _normalise_line_breaks(self, values: list[bytes | None], candidates: list[int], bad: dict[int, str]) -> None:
        """Arrow reads one document per line: re-serialise the rare value that spans lines."""
        for i in candidates:
            value = values[i]
            assert value is not None
            if b"\n" in value or b"\r" in value:
                try:
                    values[i] = json.dumps(json.loads(value), separators=(",", ":")).encode()
                except (ValueError, UnicodeDecodeError) as error:
                    bad[i] = f"not valid JSON: {error}"

    def _try(self, values: list[bytes | None], indices: list[int]) -> pa.Table:
        payload = b"\n".join(values[i] for i in indices)  # type: ignore[misc]
        options = pj.ReadOptions(block_size=max(1 << 20, len(payload) // 4 + 1), use_threads=True)
        try:
            table = pj.read_json(pa.py_buffer(payload), read_options=options, parse_options=self._options)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise _Bad(str(error)) from None
        if table.num_rows != len(indices):
            raise _Bad(f"value holds {table.num_rows} JSON documents; expected one object")
        return self._finish(table)

    def _finish(self, table: pa.Table) -> pa.Table:
        columns = []
        for spec in self.fields:
            column = table.column(spec.name)
            target = arrow_type(spec.type)
            if column.type != target:
                try:
                    column = pc.cast(column, target, safe=spec.type != "float")
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                    raise _Bad(f"field {spec.name!r}: cannot convert to {spec.type}: {error}") from None
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._field_schema)

    def _parse(
        self,
        values: list[bytes | None],
        indices: list[int],
        parts: list[tuple[list[int], pa.Table]],
        bad: dict[int, str],
    ) -> None:
        """Parse ``indices`` into ``parts`` (in order), bisecting around records that fail."""
        if not indices:
            return
        if len(indices) <= _SINGLES:
            for i in indices:
                try:
                    self._keep(self._try(values, [i]), [i], parts, bad)
                except _Bad as error:
                    bad[i] = self._explain(values[i], str(error))
            return
        try:
            table = self._try(values, indices)
        except _Bad:
            middle = len(indices) // 2
            self._parse(values, indices[:middle], parts, bad)
            self._parse(values, indices[middle:], parts, bad)
            return
        self._keep(table, indices, parts, bad)

    def _keep(
        self,
        table: pa.Table,
        indices: list[int],
        parts: list[tuple[list[int], pa.Table]],
        bad: dict[int, str],
    ) -> None:
        """Split off rows with nulls in required fields; keep the rest."""
        missing = None
        for spec in self.fields:
            if spec.required:
                nulls = pc.is_null(table.column(spec.name))
                missing = nulls if missing is None else pc.or_(missing, nulls)
        if missing is not None and pc.any(missing).as_py():
            flags = missing.to_pylist()
            for row, flag in enumerate(flags):
                if flag:
                    names = [s.name for s in self.fields if s.required and not table.column(s.name)[row].is_valid]
                    bad[indices[row]] = f"required field(s) {', '.join(map(repr, names))} missing or null"
            table = table.filter(pc.invert(missing))
            indices = [i for i, flag in zip(indices, flags, strict=True) if not flag]
        if indices:
            parts.append((indices, table))

    def _explain(self, value: bytes | None, arrow_message: str) -> str:
        try:
            document = json.loads(value or b"")
        except (ValueError, UnicodeDecodeError) as error:
            return f"not valid JSON: {error}"
        if not isinstance(document, dict):
            return f"JSON value is not an object (got {type(document).__name__})"
        types = {f.name: f.type for f in self.fields}
        match = _ARROW_COLUMN.search(arrow_message)
        if match and match.group("col") in types:
            column = match.group("col")
            return f"field {column!r}: expected {types[column]}, got a JSON {match.group('got')}"
        match = _ARROW_CONVERT.search(arrow_message)
        if match:
            for name, type_name in types.items():
                got = document.get(name)
                if got is not None and str(got) in match.group("got"):
                    return f"field {name!r}: cannot convert {got!r} to {type_name}"
        return arrow_message

    def _assemble(self, chunk: RawChunk, good: list[int], fields: pa.Table) -> pa.Table:
        take = pa.array(good, type=pa.int64())
        columns = [
            chunk.topic.take(take),
            chunk.partition.take(take),
            chunk.offset.take(take),
            chunk.timestamp.take(take),
            chunk.key.take(take),
            *fields.columns,
        ]
        return pa.Table.from_arrays(columns, schema=self._schema)

    def _dead_letters(self, chunk: RawChunk, bad: dict[int, str]) -> pa.Table:
        order = sorted(bad)
        take = pa.array(order, type=pa.int64())
        headers = []
        for i in order:
            raw = chunk.headers(i)
            headers.append([{"key": k, "value": v} for k, v in raw] if raw else [])
        columns = [
            chunk.topic.take(take),
            chunk.partition.take(take),
            chunk.offset.take(take),
            chunk.timestamp.take(take),
            chunk.key.take(take),
            pa.array([chunk.values[i] for i in order], type=pa.binary()),
            pa.array(headers, type=DEAD_LETTER_SCHEMA.field("headers").type),
            pa.array([bad[i] for i in order], type=pa.string()),
        ]
        return pa.Table.from_arrays(columns, schema=DEAD_LETTER_SCHEMA)
