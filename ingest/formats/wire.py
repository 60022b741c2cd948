"""The Confluent wire format every registry format shares: a zero magic byte, the writer schema's
4-byte registry id, then the body in the schema's encoding.

:class:`RegistryDecoder` does what does not depend on the encoding: it groups a chunk's values by
schema id (prefixes read with numpy over the joined values, not a Python step per record), sends
values that are not framed so to the dead letters with the reason, decides once per schema id how
its records are read (:meth:`RegistryDecoder._reading`: decoded into the table's fields, set aside
as dead letters, the batch stopped, or the batch to be produced again for an evolved table, by
``on_schema_change``), and assembles the rows. A format supplies the mapping of its schemas to
table fields and the decoding of a group of values of one schema id.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from ingest.errors import Firsts, SchemaAhead, SchemaChangeRefused, firsts_text
from ingest.format_names import Format, OnSchemaChange
from ingest.formats.rows import assemble, dead_letters
from ingest.ports import SchemaRegistry, WriterSchema
from ingest.records import Declared, Decoded, Field, RawChunk, merge, renamed, rows_schema
from ingest.type_names import arrow_type

PREFIX = 5

#: the rows of a group's decoded records: their positions in the chunk, and their fields
Parts = list[tuple[Sequence[int], pa.Table]]
#: the row fields of a value's fields, where a value is an event around its row (a Debezium change
#: event's ``after`` record: :func:`ingest.formats.changelog.debezium_row`); raises :class:`Refused`
RowOf = Callable[[Sequence[Declared]], list[Field]]


class Refused(ValueError):
    """A writer schema no Iceberg table can hold (the message says which part and why)."""


@dataclass
class Reading:
    """How records of one writer schema id are read: decoded (with ``plan``, the format's own), or
    all dead letters for ``reason``, or (``ahead``) not before the table evolves."""

    schema_id: int
    plan: Any = None
    reason: str | None = None
    ahead: bool = False


def parse_json(text: str, what: str) -> Any:
    """A schema's JSON text (Avro's, JSON Schema's) parsed; :class:`Refused` if it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise Refused(f"{what} is not JSON: {error}") from None


def dependencies(references: Sequence[tuple[str, WriterSchema]]) -> list[tuple[str, WriterSchema]]:
    """Every schema ``references`` names, directly or through their own, each once by its name,
    each after the schemas it refers to (the order to define or build them in)."""
    ordered: dict[str, WriterSchema] = {}
    visiting: set[str] = set()

    def visit(name: str, schema: WriterSchema) -> None:
        if name in ordered or name in visiting:  # a registry refuses cycles; never loop on one
            return
        visiting.add(name)
        for inner in schema.references:
            visit(*inner)
        ordered[name] = schema

    for reference in references:
        visit(*reference)
    return list(ordered.items())


def prefix(schema_id: int) -> bytes:
    return struct.pack(">bI", 0, schema_id)


def framing_problem(value: bytes | None, part: str = "value") -> str | None:
    """Why ``value`` (a record's value, or its key: ``part``) is not in the Confluent wire format
    (None: it is)."""
    if value is None:
        return f"{part} is null (a tombstone); expected a record in the Confluent wire format"
    if len(value) < PREFIX:
        return (
            f"{part} is {len(value)} bytes; the Confluent wire format starts with 5 (a zero magic byte and the "
            "schema id)"
        )
    if value[0] != 0:
        hint = " (it looks like JSON)" if value[:1] in (b"{", b"[") else ""
        return f"wrong magic byte 0x{value[0]:02x}{hint}: not the Confluent wire format, which starts with 0x00"
    return None


def group(values: list[bytes | None], bad: dict[int, str], part: str = "value") -> dict[int, Sequence[int]]:
    """The positions of the framed values by schema id; the others go to ``bad`` with the reason.
    The prefixes are read with numpy, all at once."""
    n = len(values)
    if not n:
        return {}
    whole = all(values)
    present = values if whole else [v or b"" for v in values]
    lengths = np.fromiter(map(len, present), np.int64, n)  # type: ignore[arg-type]
    # (padded: the prefix of a value shorter than one is read past the end, then set aside)
    data = np.frombuffer(b"".join(present) + bytes(PREFIX), np.uint8)  # type: ignore[arg-type]
    starts = np.cumsum(lengths) - lengths
    framed = (lengths >= PREFIX) & (data[starts] == 0)
    ids = (data[starts + 1].astype(np.int64) << 24) | (data[starts + 2].astype(np.int64) << 16)
    ids |= (data[starts + 3].astype(np.int64) << 8) | data[starts + 4].astype(np.int64)
    if framed.all():
        unique = np.unique(ids)
        if len(unique) == 1:
            return {int(unique[0]): range(n)}
        return {int(i): np.flatnonzero(ids == i).tolist() for i in unique}
    for i in np.flatnonzero(~framed).tolist():
        bad[i] = framing_problem(values[i], part) or "not in the Confluent wire format"
    positions, ids = np.flatnonzero(framed), ids[framed]
    return {int(i): positions[ids == i].tolist() for i in np.unique(ids)}


def _firsts(chunk: RawChunk, positions: Sequence[int]) -> Firsts:
    """The coordinates of the first record at ``positions`` of ``chunk`` in each partition."""
    first: dict[tuple[str, int], int] = {}
    topics, partitions, offsets = chunk.topic.to_pylist(), chunk.partition.to_pylist(), chunk.offset.to_pylist()
    for i in positions:
        at = (topics[i], partitions[i])
        first[at] = min(first.get(at, offsets[i]), offsets[i])
    return tuple((topic, partition, offset) for (topic, partition), offset in sorted(first.items()))


class RegistryDecoder:
    """Decodes Confluent-framed values of one format into rows of the table's ``fields``."""

    #: the format decoded, its row of :data:`ingest.format_names.FORMATS` (its registry schema type, its label)
    format: ClassVar[Format]

    def __init__(
        self,
        fields: Sequence[Declared],
        registry: SchemaRegistry,
        on_change: OnSchemaChange,
        renames: Mapping[str, str] | None = None,
        row: RowOf | None = None,
    ) -> None:
        self.fields = list(fields)
        self.registry = registry
        self.on_change = on_change
        #: top-level fields the writers renamed, old name → the table's (``renames:``)
        self.renames = dict(renames or {})
        #: a value's row fields of its fields: a value is a change event around its row (``fields``
        #: are the event's, and the table's columns are its row's); None: a value is its row
        self.row = row
        self._row_fields = row(self.fields) if row is not None else self.fields
        #: what this decoder reads of each record, in messages: ``value``, or ``key``
        self.part = "value"
        self._schema = rows_schema(self.fields)
        self._field_schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in self.fields])
        self._readings: dict[int, Reading] = {}

    # -- what a format supplies

    @staticmethod
    def writer_fields(writer: WriterSchema) -> list[Field]:
        """The table fields of a writer schema of this format, under the writer's names (raises
        :class:`Refused` saying what does not map)."""
        raise NotImplementedError

    def plan(self, writer: WriterSchema) -> Any:
        """What decoding records of ``writer`` (whose fields the table has, under the table's names:
        ``self.renames`` applied) needs, made once per id."""
        return None

    def decode_group(self, reading: Reading, values: list[bytes | None], index: Sequence[int], parts: Parts,
                     bad: dict[int, str]) -> None:  # fmt: skip
        """Decode the values at ``index`` (all of ``reading.schema_id``, framed) into ``parts``; the
        ones that do not decode go to ``bad`` with the reason."""
        raise NotImplementedError

    # -- per schema id

    def _reading(self, schema_id: int) -> Reading:
        reading = self._readings.get(schema_id)
        if reading is None:
            reading = self._readings[schema_id] = self._resolve(schema_id)
        return reading

    def _resolve(self, schema_id: int) -> Reading:
        writer = self.registry.by_id(schema_id)
        if writer is None:
            return Reading(schema_id, reason=f"unknown schema id {schema_id}: the Schema Registry has no such schema")
        if writer.kind != self.format.registry_kind:
            written = f"written with a {writer.kind} schema (id {schema_id})"
            return Reading(schema_id, reason=f"{written}; this topic is read as {self.format.label}")
        try:
            writer_fields = renamed(self.writer_fields(writer), self.renames)
            if self.row is not None:
                writer_fields = self.row(writer_fields)
        except Refused as error:
            return self._changed(schema_id, f"schema id {schema_id} cannot be a table's schema: {error}", fatal=True)
        merged = merge(self._row_fields, writer_fields)
        if merged.problems:
            problems = "; ".join(merged.problems)
            return self._changed(
                schema_id,
                f"schema id {schema_id} changes a column's type in a way Iceberg cannot follow: {problems}",
                fatal=True,
            )
        if merged.changes(self._row_fields):
            added = [f.name for f in merged.fields if f.name not in {g.name for g in self._row_fields}]
            what = f"adds {', '.join(added)}" if added else "widens or relaxes columns"
            return self._changed(schema_id, f"schema id {schema_id} {what}, which the table does not have", fatal=False)
        return Reading(schema_id, self.plan(writer))

    def _changed(self, schema_id: int, reason: str, *, fatal: bool) -> Reading:
        if self.on_change == "dead_letter":
            return Reading(schema_id, reason=f"{reason} (on_schema_change: dead_letter)")
        if fatal or self.on_change == "fail":
            advice = "Set `on_schema_change: dead_letter` to set such records aside"
            advice += ", or `evolve` to let the table follow." if not fatal else ", or write it into a new table."
            raise SchemaChangeRefused(f"{reason}. Nothing was committed. {advice}")
        return Reading(schema_id, ahead=True)

    # -- per chunk

    def decode(self, chunk: RawChunk) -> Decoded:
        values = chunk.values
        bad: dict[int, str] = {}
        groups = group(values, bad, self.part)
        ahead = [schema_id for schema_id in groups if self._reading(schema_id).ahead]
        if ahead:
            ids = ", ".join(f"schema id {i}" for i in sorted(ahead))
            first = _firsts(chunk, [i for schema_id in ahead for i in groups[schema_id]])
            raise SchemaAhead(
                f"records were written with {ids}, which the table's schema must evolve to take (the first: "
                f"{firsts_text(first)}); the batch is produced again for the evolved schema",
                tuple(sorted(ahead)),
                first=first,
            )
        parts: Parts = []
        for schema_id, index in groups.items():
            reading = self._reading(schema_id)
            if reading.reason is not None:
                bad.update(dict.fromkeys(index, reading.reason))
            else:
                self.decode_group(reading, values, index, parts, bad)
        if len(parts) == 1 and len(parts[0][0]) == len(values):
            good: Sequence[int] | None = None
        else:
            good = [i for indices, _ in parts for i in indices]
        fields = pa.concat_tables([t for _, t in parts]) if parts else self._field_schema.empty_table()
        rows = assemble(chunk, good, fields.combine_chunks(), self._schema)
        return Decoded(rows=rows, dead_letters=dead_letters(chunk, bad))
