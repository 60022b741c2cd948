"""Avro values in the Confluent wire format (a zero magic byte, the writer schema's 4-byte registry
id, the Avro binary body), decoded a chunk at a time into Arrow.

The fast path relies on a property of Avro's encoding: records of one writer schema, concatenated,
are the body of an object-container block. Each value is kept whole, its 5-byte prefix read as an
Avro ``fixed(5)`` field of an envelope record around the writer schema, so the values of a schema id
are joined as they are and decoded by polars' native Avro reader, with no Python object per record.
Every envelope's prefix must come back as the bytes it was written with: a record that is
truncated or longer than its schema shifts the ones after it, the check fails, and the block is
bisected until the record stands alone, as the JSON decoder does, and goes to the dead letters
with the reader's complaint.

The decoded columns are then conformed to the table's fields by name (the writer's enums to
strings, maps to Arrow maps, narrower numbers widened); a field the writer lacks is null. The
framing, and which writer schemas may be conformed at all (by ``on_schema_change``), are the wire
format's (:mod:`ingest.formats.wire`). The mapping from Avro to the table's types is :func:`record_fields`'s.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ingest.format_names import FORMAT
from ingest.formats.rows import assemble, dead_letters
from ingest.formats.wire import PREFIX, Parts, Reading, Refused, RegistryDecoder, dependencies, parse_json, prefix
from ingest.ports import WriterSchema
from ingest.records import OWN_COLUMNS, Declared, Decoded, Field, RawChunk, renaming, rows_schema
from ingest.type_names import arrow_type

#: Avro's primitives, as the table's types
_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}
_LOGICAL = {
    "date": "date",
    "time-millis": "time",
    "time-micros": "time",
    "timestamp-millis": "timestamptz",
    "timestamp-micros": "timestamptz",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "uuid": "string",
}
#: the synchronisation marker of the object-container blocks built here (any 16 bytes do)
_SYNC = b"lakehouse-ingest"
#: below this many records a failing slice is decoded one record at a time
_SINGLES = 8


# --- the writer's schema, resolved -------------------------------------------------------------


@dataclass
class _Node:
    """A writer schema's type with named references resolved: what decoding and conforming need."""

    kind: str  # a primitive's table type, or record | array | map | enum
    optional: bool = False
    fields: list[tuple[str, _Node]] = field(default_factory=list)  # record
    items: _Node | None = None  # array elements, map values
    symbols: list[str] = field(default_factory=list)  # enum
    decimal: tuple[int, int] | None = None
    #: the Avro schema polars decodes this type with (enums as their index, maps as key/value arrays)
    avro: Any = None

    def type_name(self) -> str:
        if self.kind == "record":
            return "struct<" + ", ".join(f"{name}: {node.type_name()}" for name, node in self.fields) + ">"
        if self.kind == "array":
            assert self.items is not None
            return f"list<{self.items.type_name()}>"
        if self.kind == "map":
            assert self.items is not None
            return f"map<string, {self.items.type_name()}>"
        if self.kind == "enum":
            return "string"
        if self.decimal is not None:
            return f"decimal({self.decimal[0]},{self.decimal[1]})"
        return self.kind


class _Resolver:
    """Walks an Avro schema (JSON) into :class:`_Node` s, resolving named types."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.open: set[str] = set()  # records being resolved (a reference to one is recursion)
        self.count = 0

    def _fresh(self, prefix: str) -> str:
        self.count += 1
        return f"__{prefix}{self.count}"

    def node(self, schema: Any, where: str, namespace: str = "") -> _Node:
        if isinstance(schema, list):
            return self._union(schema, where, namespace)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _Node(_PRIMITIVES[schema], avro=schema)
            if schema == "null":
                raise Refused(f"{where}: a field that is always null has no Iceberg type")
            return self._reference(schema, where, namespace)
        if not isinstance(schema, dict) or "type" not in schema:
            raise Refused(f"{where}: {json.dumps(schema)[:80]} is not an Avro schema")
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if not 1 <= precision <= 38:
                raise Refused(f"{where}: decimal precision {precision} is beyond Iceberg's 38 digits")
            self._name(schema, namespace)
            return _Node(
                "decimal",
                decimal=(precision, scale),
                avro={**schema, "name": self._fresh("d")} if kind == "fixed" else schema,
            )
        if isinstance(kind, str) and logical in _LOGICAL and kind in ("int", "long", "string"):
            return _Node(_LOGICAL[logical], avro=schema)
        if kind == "record":
            return self._record(schema, where, namespace)
        if kind == "enum":
            self._name(schema, namespace)
            return _Node("enum", symbols=list(schema["symbols"]), avro="int")
        if kind == "fixed":
            self._name(schema, namespace)
            return _Node("binary", avro={"type": "fixed", "name": self._fresh("f"), "size": schema["size"]})
        if kind == "array":
            items = self.node(schema["items"], f"{where}[]", namespace)
            return _Node("array", items=items, avro={"type": "array", "items": items.avro})
        if kind == "map":
            values = self.node(schema["values"], f"{where}{{}}", namespace)
            entry = {
                "type": "record",
                "name": self._fresh("m"),
                "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": values.avro}],
            }
            return _Node("map", items=values, avro={"type": "array", "items": entry})
        return self.node(kind, where, namespace)  # {"type": "string"} and the like

    def _name(self, schema: dict[str, Any], namespace: str) -> str:
        name = str(schema.get("name", ""))
        space = schema.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        self.named[full] = schema
        return full

    def _reference(self, name: str, where: str, namespace: str) -> _Node:
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        schema = self.named.get(full, self.named.get(name))
        if schema is None:
            raise Refused(f"{where}: unknown type {name!r}")
        if full in self.open or name in self.open:
            raise Refused(f"{where}: record {name!r} contains itself; recursive types have no Iceberg form")
        return self.node(schema, where, namespace)

    def _union(self, branches: list[Any], where: str, namespace: str) -> _Node:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            shown = ", ".join(b if isinstance(b, str) else str(b.get("type")) for b in others)
            raise Refused(
                f"{where}: a union of several types ({shown}) has no Iceberg column type; only a union of null "
                "and one type (an optional field) maps to a column"
            )
        node = self.node(others[0], where, namespace)
        node.optional = len(branches) > 1
        node.avro = [b if b == "null" else node.avro for b in branches]
        return node

    def _record(self, schema: dict[str, Any], where: str, namespace: str) -> _Node:
        full = self._name(schema, namespace)
        space = full.rpartition(".")[0]
        self.open.add(full)
        fields: list[tuple[str, _Node]] = []
        for item in schema.get("fields", []):
            name = item["name"]
            fields.append((name, self.node(item["type"], f"{where}.{name}" if where else name, space)))
        self.open.discard(full)
        avro = {
            "type": "record",
            "name": self._fresh("r"),
            "fields": [{"name": name, "type": node.avro} for name, node in fields],
        }
        return _Node("record", fields=fields, avro=avro)


def _resolve(text: str, references: Sequence[tuple[str, WriterSchema]] = ()) -> _Node:
    """The record ``text`` declares, its named types looked up in the schemas it refers to too
    (an Avro reference names a schema of another subject that defines them)."""
    resolver = _Resolver()
    for name, referenced in dependencies(references):
        resolver.node(parse_json(referenced.text, f"referenced schema {name!r}"), name)
    node = resolver.node(parse_json(text, "the schema"), "")
    if node.kind != "record" or node.optional:
        raise Refused(f"the schema is a {node.type_name()}, not a record: a table needs named fields")
    return node


def _renamed(node: _Node, renames: Mapping[str, str]) -> _Node:
    """A record's top-level fields under the table's names (Avro's encoding has no names: the
    values are read as they are)."""
    if not renames:
        return node
    apply = renaming([name for name, _ in node.fields], renames)
    return replace(node, fields=[(apply.get(name, name), child) for name, child in node.fields])


def record_fields(text: str, references: Sequence[tuple[str, WriterSchema]] = ()) -> list[Field]:
    """The table fields an Avro record schema maps to (raises :class:`Refused` saying what does not
    map): primitives as themselves (``bytes`` and ``fixed`` as binary), logical types as Iceberg's
    (decimal, date, time, timestamp(tz), uuid as string), a union with null as an optional field,
    records as structs, arrays as lists, maps as ``map<string, …>``, enums as strings. Named types
    may come from referenced schemas."""
    node = _resolve(text, references)
    for name, _ in node.fields:
        if name in OWN_COLUMNS:
            raise Refused(f"{name}: the pipeline adds a column of that name itself")
    return [Field(name, child.type_name(), not child.optional) for name, child in node.fields]


# --- conforming decoded columns to the table's types ------------------------------------------


class _Bad(Exception):
    pass


def _conform(array: pa.Array, node: _Node, target: pa.DataType) -> pa.Array:
    """``array`` (as polars decoded ``node``) as an array of ``target`` type."""
    if node.kind == "record":
        assert isinstance(array, pa.StructArray)
        have = {name: (i, child) for i, (name, child) in enumerate(node.fields)}
        children = []
        for target_field in target:
            found = have.get(target_field.name)
            if found is None:
                children.append(pa.nulls(len(array), target_field.type))
            else:
                children.append(_conform(array.field(found[0]), found[1], target_field.type))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_nulls(array))
    if node.kind in ("array", "map"):
        assert node.items is not None
        offsets = pc.cast(array.offsets, pa.int32())
        if node.kind == "array":
            values = _conform(array.values, node.items, target.value_type)
            return pa.ListArray.from_arrays(offsets, values, type=target, mask=_nulls(array))
        entries = array.values
        keys = pc.cast(entries.field(0), target.key_type)
        values = _conform(entries.field(1), node.items, target.item_type)
        return pa.MapArray.from_arrays(offsets, keys, values, type=target, mask=_nulls(array))
    if node.kind == "enum":
        indices = pc.cast(array, pa.int32())
        if pc.any(pc.greater_equal(indices, len(node.symbols))).as_py() or pc.any(pc.less(indices, 0)).as_py():
            raise _Bad(f"an enum index outside the writer schema's {len(node.symbols)} symbols")
        return pc.cast(pa.array(node.symbols, pa.string()).take(indices), target)
    try:
        return pc.cast(array, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise _Bad(f"cannot convert {node.type_name()} to {target}: {error}") from None


def _nulls(array: pa.Array) -> pa.Array | None:
    return pc.is_null(array) if array.null_count else None


# --- the decoder ---------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _container(schema: bytes, values: Sequence[bytes], count: int | None = None) -> bytes:
    """An Avro object-container file of one uncompressed block holding ``values`` joined as its
    ``count`` records (default: one per value)."""
    body = b"".join(values)
    meta = [(b"avro.schema", schema), (b"avro.codec", b"null")]
    header = b"Obj\x01" + _varint(len(meta))
    for key, value in meta:
        header += _varint(len(key)) + key + _varint(len(value)) + value
    records = len(values) if count is None else count
    return b"".join([header, _varint(0), _SYNC, _varint(records), _varint(len(body)), body, _SYNC])


class AvroDecoder(RegistryDecoder):
    """Decodes Confluent-framed Avro values into rows of the table's ``fields``."""

    format = FORMAT["avro"]

    @staticmethod
    def writer_fields(writer: WriterSchema) -> list[Field]:
        return record_fields(writer.text, writer.references)

    def plan(self, writer: WriterSchema) -> tuple[_Node, bytes]:
        """The writer's resolved type, and the envelope schema its values are decoded with."""
        node = _renamed(_resolve(writer.text, writer.references), self.renames)
        envelope = {
            "type": "record",
            "name": "__envelope",
            "fields": [
                {"name": "prefix", "type": {"type": "fixed", "name": "__prefix", "size": PREFIX}},
                {"name": "value", "type": node.avro},
            ],
        }
        return node, json.dumps(envelope).encode()

    def decode_group(
        self, reading: Reading, values: list[bytes | None], index: Sequence[int], parts: Parts, bad: dict[int, str]
    ) -> None:
        node, envelope = reading.plan
        expected = prefix(reading.schema_id)

        def block(group: list[bytes]) -> pa.Table:
            decoded = _read(_container(envelope, group), len(group))
            prefixes = decoded.column("prefix")
            if not pc.all(pc.equal(prefixes, pa.scalar(expected, prefixes.type))).as_py():
                raise _Bad("the values do not end where their schema says")
            return _rows(decoded, node, self._field_schema)

        reason = (
            f"does not decode as Avro with schema id {reading.schema_id} ({{}}): truncated, corrupt, or written "
            "with another schema than its prefix names"
        )
        _bisect(block, values, index, 0, len(index), parts, bad, reason)


def _read(container: bytes, count: int) -> pa.Table:
    """The records of an object-container file, as polars reads them into Arrow."""
    try:
        decoded = pl.read_avro(io.BytesIO(container)).to_arrow()
    except BaseException as error:  # polars raises a PanicException, not an Exception, on some input
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        raise _Bad(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    if decoded.num_rows != count:
        raise _Bad(f"{decoded.num_rows} records decoded from {count} values")
    return decoded


def _rows(decoded: pa.Table, node: _Node, fields: pa.Schema) -> pa.Table:
    """The envelopes' ``value`` records as rows of ``fields``."""
    try:
        conformed = _conform(decoded.column("value").combine_chunks(), node, pa.struct(list(fields)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise _Bad(str(error)) from None
    assert isinstance(conformed, pa.StructArray)
    return pa.Table.from_struct_array(conformed)


def _bisect(
    block: Callable[[list[bytes]], pa.Table],
    values: list[bytes | None],
    index: Sequence[int],
    lo: int,
    hi: int,
    parts: Parts,
    bad: dict[int, str],
    reason: str,
) -> None:
    """Decode the values at ``index[lo:hi]`` with ``block`` into ``parts``, bisecting around the ones
    that fail; one failing alone goes to ``bad`` with ``reason`` (``{}``: the reader's complaint)."""
    if hi <= lo:
        return
    try:
        table = block([values[i] for i in index[lo:hi]])  # type: ignore[misc]
    except _Bad as error:
        if hi - lo == 1:
            bad[index[lo]] = reason.format(error)
            return
        middle = (lo + hi) // 2 if hi - lo > _SINGLES else lo + 1
        _bisect(block, values, index, lo, middle, parts, bad, reason)
        _bisect(block, values, index, middle, hi, parts, bad, reason)
        return
    parts.append((index[lo:hi], table))


_POSITIONS: list[bytes] = []


def _varints(n: int) -> list[bytes]:
    """The Avro encodings of ``0..n-1`` (made once, kept for the next chunk)."""
    _POSITIONS.extend(_varint(i) for i in range(len(_POSITIONS), n))
    return _POSITIONS[:n]


class AvroFileDecoder:
    """Decodes plain Avro bodies (no wire-format prefix) of one writer schema, from a schema file,
    into rows of the table's ``fields``. With no prefix to read back, each value is followed by its
    position as an Avro ``long`` in the block, and the decoded positions must come back as
    ``0..n-1``: a value shorter or longer than its schema shifts them, and the block is bisected."""

    def __init__(self, fields: Sequence[Declared], schema_text: str, renames: Mapping[str, str] | None = None) -> None:
        self.fields = list(fields)
        self._schema = rows_schema(self.fields)
        self._field_schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in self.fields])
        self._node = _renamed(_resolve(schema_text), renames or {})
        envelope = {
            "type": "record",
            "name": "__envelope",
            "fields": [{"name": "value", "type": self._node.avro}, {"name": "position", "type": "long"}],
        }
        self._envelope = json.dumps(envelope).encode()

    def decode(self, chunk: RawChunk) -> Decoded:
        values = chunk.values
        bad: dict[int, str] = {}
        index = [i for i, v in enumerate(values) if v is not None] if not all(values) else range(len(values))
        for i, value in enumerate(values):
            if value is None:
                bad[i] = "value is null (a tombstone); expected an Avro record"
        parts: Parts = []
        reason = "does not decode as Avro with the schema file's schema ({})"
        _bisect(self._block, values, index, 0, len(index), parts, bad, reason)
        good = [i for indices, _ in parts for i in indices]
        fields = pa.concat_tables([t for _, t in parts]) if parts else self._field_schema.empty_table()
        whole = good if len(good) != len(values) else None
        return Decoded(assemble(chunk, whole, fields.combine_chunks(), self._schema), dead_letters(chunk, bad))

    def _block(self, values: list[bytes]) -> pa.Table:
        marked = [part for pair in zip(values, _varints(len(values)), strict=True) for part in pair]
        decoded = _read(_container(self._envelope, marked, len(values)), len(values))
        if not np.array_equal(decoded.column("position").to_numpy(), np.arange(len(values))):
            raise _Bad("the values do not end where the schema says")
        return _rows(decoded, self._node, self._field_schema)
