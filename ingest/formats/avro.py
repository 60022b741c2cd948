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
format's (:mod:`ingest.formats.wire`); the mapping from Avro to the table's types is
:mod:`ingest.formats.avro_schema`'s.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ingest.format_names import FORMAT
from ingest.formats.avro_scan import walk
from ingest.formats.avro_schema import Node, record_fields, resolve
from ingest.formats.rows import assemble, dead_letters
from ingest.formats.wire import PREFIX, Parts, Reading, RegistryDecoder, prefix
from ingest.ports import WriterSchema
from ingest.records import Declared, Decoded, Field, RawChunk, rows_schema
from ingest.type_names import arrow_type

#: the synchronisation marker of the object-container blocks built here (any 16 bytes do)
_SYNC = b"lakehouse-ingest"
#: below this many records a failing slice is decoded one record at a time
_SINGLES = 8


# --- conforming decoded columns to the table's types ------------------------------------------


class _Bad(Exception):
    pass


def _conform(array: pa.Array, node: Node, target: pa.DataType) -> pa.Array:
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

    def plan(self, writer: WriterSchema) -> tuple[Node, bytes]:
        """The writer's resolved type, and the envelope schema its values are decoded with."""
        node = resolve(writer.text, writer.references).renamed(self.renames)
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
        _decode(block, node, PREFIX, values, index, parts, bad, reason)


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


def _rows(decoded: pa.Table, node: Node, fields: pa.Schema) -> pa.Table:
    """The envelopes' ``value`` records as rows of ``fields``."""
    try:
        conformed = _conform(decoded.column("value").combine_chunks(), node, pa.struct(list(fields)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise _Bad(str(error)) from None
    assert isinstance(conformed, pa.StructArray)
    return pa.Table.from_struct_array(conformed)


def _decode(
    block: Callable[[list[bytes]], pa.Table],
    node: Node,
    start: int,
    values: list[bytes | None],
    index: Sequence[int],
    parts: Parts,
    bad: dict[int, str],
    reason: str,
) -> None:
    """Decode the values at ``index`` with ``block`` into ``parts`` as one block; when it fails, the
    values whose bodies (from ``start``) are not one record of ``node`` go to ``bad`` first, found
    in one pass (:mod:`ingest.formats.avro_scan`), a value with bytes after its record is read as
    that record, and the others are bisected (normally one block that decodes)."""
    kept = [values[i] for i in index]
    try:
        parts.append((index, block(kept)))  # type: ignore[arg-type]
        return
    except _Bad:
        pass
    walked = walk(node, kept, start)  # type: ignore[arg-type]
    if walked is None or not (walked.misfits or walked.longer):
        middle = len(index) // 2 if len(index) > _SINGLES else 1  # what bisection would have tried next
        _bisect(block, values, index, 0, middle, parts, bad, reason)
        _bisect(block, values, index, middle, len(index), parts, bad, reason)
        return
    if walked.longer:  # each read as its record, the bytes after it ignored
        values = list(values)
        for j, length in walked.longer.items():
            values[index[j]] = kept[j][:length]  # type: ignore[index]
    bad.update({index[j]: reason.format(why) for j, why in walked.misfits.items()})
    keep = np.ones(len(index), np.bool_)
    keep[list(walked.misfits)] = False
    index = np.asarray(index)[keep].tolist()
    _bisect(block, values, index, 0, len(index), parts, bad, reason)


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
        self._node = resolve(schema_text).renamed(renames or {})
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
        _decode(self._block, self._node, 0, values, index, parts, bad, reason)
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
