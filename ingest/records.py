"""What the pipeline writes: the one definition of its columns, its fields and its partition
transforms (type names are :mod:`ingest.type_names`).

Every table a pipeline writes says where each record was in Kafka (:class:`Coordinates`): the rows
table in ``_kafka_*`` columns beside the declared fields, the dead-letter table in plain ones
beside the raw value and the error. The Arrow schemas here are the source: the decoder produces
them, and the Iceberg adapter derives the tables' schemas from them (field ids assigned as Iceberg
assigns fresh ones).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from ingest.type_names import arrow_type, type_name

#: a ``partition_by`` item: ``day(created_at)``, ``bucket(16, customer_id)``, or a bare column
TRANSFORM = re.compile(
    r"^(?:(?P<fn>identity|year|month|day|hour)\((?P<col>\w+)\)"
    r"|(?P<wfn>bucket|truncate)\((?P<n>[1-9]\d*)\s*,\s*(?P<wcol>\w+)\)"
    r"|(?P<bare>\w+))$"
)


@dataclass(frozen=True)
class Coordinates:
    """Where each record was in Kafka, as the column names of one table."""

    topic: str
    partition: str
    offset: str
    timestamp: str
    key: str

    @property
    def names(self) -> tuple[str, str, str, str, str]:
        return (self.topic, self.partition, self.offset, self.timestamp, self.key)

    def fields(self) -> list[pa.Field]:
        return [
            pa.field(self.topic, pa.string(), nullable=False),
            pa.field(self.partition, pa.int32(), nullable=False),
            pa.field(self.offset, pa.int64(), nullable=False),
            pa.field(self.timestamp, pa.timestamp("us", tz="UTC")),
            pa.field(self.key, pa.binary()),
        ]


#: the rows table's coordinate columns (declared fields may not use these names)
ROWS = Coordinates("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key")
#: the dead-letter table's coordinate columns
DEAD_LETTERS = Coordinates("topic", "partition", "offset", "timestamp", "key")
RESERVED_COLUMNS = ROWS.names
#: the column record keys are decoded into when the topics have a ``key_format`` (the raw key stays
#: in ``_kafka_key``); to the table it is one more optional field, evolved as value fields are
KEY_COLUMN = "_kafka_key_decoded"
#: the column a JSON record's fields the table does not declare are kept in, as one JSON object
#: (``unknown_fields: capture``)
EXTRA_COLUMN = "_extra"
#: the column a record's Kafka headers are kept in (``headers: true``): each key's last value
HEADERS_COLUMN = "_kafka_headers"
HEADERS_TYPE = "map<string, binary>"
#: the names the pipeline's own columns take, which no field of the records may
#: the column decoding adds with ``route_by``: the table each row goes to (never written to a table)
ROUTE_COLUMN = "_ingest_route"
OWN_COLUMNS = (*ROWS.names, KEY_COLUMN, EXTRA_COLUMN, HEADERS_COLUMN, ROUTE_COLUMN)

KAFKA_COLUMNS = pa.schema(ROWS.fields())

DEAD_LETTER_SCHEMA = pa.schema(
    [
        *DEAD_LETTERS.fields(),
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


#: a record's headers as Kafka delivers them
Headers = list[tuple[str, bytes | None]] | None


@dataclass
class RawChunk:
    """Records as read from Kafka, column-wise. ``headers(i)`` is called for dead letters, and for
    every record with ``headers: true``: building them costs, so only then."""

    topic: pa.Array
    partition: pa.Array
    offset: pa.Array
    timestamp: pa.Array
    key: pa.Array
    values: list[bytes | None]
    headers: Callable[[int], Headers]
    nbytes: int
    #: the keys decoded (``key_format``), one per record: decoders put it beside the coordinates
    decoded_key: pa.Array | None = None
    #: the headers as a map per record (``headers: true``): decoders put it beside the coordinates
    header_map: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.values)

    def take(self, positions: Sequence[int]) -> RawChunk:
        """The records at ``positions``, in that order."""
        index = pa.array(positions, type=pa.int64())
        values = [self.values[i] for i in positions]
        return RawChunk(
            self.topic.take(index),
            self.partition.take(index),
            self.offset.take(index),
            self.timestamp.take(index),
            self.key.take(index),
            values,
            lambda i: self.headers(positions[i]),
            sum(map(len, filter(None, values))),
            None if self.decoded_key is None else self.decoded_key.take(index),
            None if self.header_map is None else self.header_map.take(index),
        )


@dataclass
class Decoded:
    """A chunk decoded: rows of the rows table's schema, and dead letters of :data:`DEAD_LETTER_SCHEMA`."""

    rows: pa.Table
    dead_letters: pa.Table
    #: records (rows or dead letters) with fields the table does not declare (JSON values)
    unknown: int = 0


class Declared(Protocol):
    """A declared field of the rows table (``schema:`` in the config)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def required(self) -> bool: ...

    @property
    def doc(self) -> str | None: ...


def rows_schema(fields: Sequence[Declared], *, docs: bool = False) -> pa.Schema:
    """The rows table: the Kafka coordinates, then the declared fields in their order (with
    ``docs``, each field's ``doc`` in its metadata, where Iceberg's conversion finds it)."""
    declared = [
        pa.field(
            f.name, arrow_type(f.type), nullable=not f.required, metadata={"doc": f.doc} if docs and f.doc else None
        )
        for f in fields
    ]
    return pa.schema([*KAFKA_COLUMNS, *declared])


@dataclass(frozen=True)
class Field:
    """A field of the rows table as a record format describes it (what :class:`Declared` declares)."""

    name: str
    type: str
    required: bool = False
    doc: str | None = None


@dataclass(frozen=True)
class Merged:
    """What a table of ``fields`` becomes to take records of another schema (:func:`merge`)."""

    fields: tuple[Field, ...]
    #: why records of the other schema cannot be represented, however the table evolves (empty if they can)
    problems: tuple[str, ...]

    def changes(self, before: Sequence[Declared]) -> bool:
        return [(f.name, f.type, f.required) for f in self.fields] != [(f.name, f.type, f.required) for f in before]


def _merge_type(path: str, table: pa.DataType, writer: pa.DataType, problems: list[str]) -> pa.DataType:
    """The type a column of ``table`` type evolves to, to take values of ``writer`` type, as Iceberg
    evolves types without rewriting data (widening only; new nested fields optional)."""
    if table == writer:
        return table
    pairs = {(pa.int32(), pa.int64()): pa.int64(), (pa.float32(), pa.float64()): pa.float64()}
    for (narrow, wide), result in pairs.items():
        if (table, writer) in ((narrow, wide), (wide, narrow)):
            return result
    if pa.types.is_decimal(table) and pa.types.is_decimal(writer) and table.scale == writer.scale:
        return pa.decimal128(max(table.precision, writer.precision), table.scale)
    if pa.types.is_struct(table) and pa.types.is_struct(writer):
        have = {f.name: f for f in writer}
        fields = [
            pa.field(f.name, _merge_type(f"{path}.{f.name}", f.type, have[f.name].type, problems))
            if f.name in have
            else f
            for f in table
        ]
        fields += [f.with_nullable(True) for f in writer if f.name not in {t.name for t in table}]
        return pa.struct(fields)
    if pa.types.is_map(table) and pa.types.is_map(writer):
        key = _merge_type(f"{path}.key", table.key_type, writer.key_type, problems)
        value = _merge_type(f"{path}.value", table.item_type, writer.item_type, problems)
        return pa.map_(pa.field("key", key, nullable=False), pa.field("value", value))
    if pa.types.is_list(table) and pa.types.is_list(writer):
        element = _merge_type(f"{path}.element", table.value_type, writer.value_type, problems)
        return pa.list_(pa.field("element", element))
    problems.append(f"{path}: the table has {type_name(table)}, the records {type_name(writer)}")
    return table


def merge(table: Sequence[Declared], writer: Sequence[Declared]) -> Merged:
    """The table's fields evolved to take records written with ``writer``'s: fields matched by
    name, the table's order kept and new fields appended as optional, types widened where Iceberg
    widens them (int→long, float→double, decimal precision; nested fields likewise), and a required
    field the writer lacks or has optional made optional. ``problems`` lists what cannot evolve so
    (a different or narrower type)."""
    problems: list[str] = []
    have = {f.name: f for f in writer}
    fields: list[Field] = []
    for f in table:
        other = have.get(f.name)
        if other is None:
            fields.append(Field(f.name, f.type, False, f.doc))
            continue
        kind = _merge_type(f.name, arrow_type(f.type), arrow_type(other.type), problems)
        fields.append(Field(f.name, type_name(kind), f.required and other.required, f.doc or other.doc))
    names = {f.name for f in table}
    fields += [Field(f.name, f.type, False, f.doc) for f in writer if f.name not in names]
    return Merged(tuple(fields), tuple(problems))


def renaming(names: Collection[str], renames: Mapping[str, str]) -> dict[str, str]:
    """The ``renames`` (old name → the table's new one; ``renames:`` in the config) that apply to
    a writer whose top-level fields are ``names``: not where the writer has the new name too (then
    the new one is read, and the old is no column: it would be one beside the renamed column)."""
    return {old: new for old, new in renames.items() if old in names and new not in names}


def renamed(fields: Sequence[Declared], renames: Mapping[str, str]) -> list[Field]:
    """A writer's top-level ``fields`` under the table's names (:func:`renaming`), a field whose
    old name the writer has beside the new one left out."""
    names = [f.name for f in fields]
    apply = renaming(names, renames)
    return [
        Field(apply.get(f.name, f.name), f.type, f.required, f.doc)
        for f in fields
        if f.name in apply or f.name not in renames
    ]


@dataclass(frozen=True)
class SortKey:
    """One ``sort_by`` item, parsed: a top-level column, ascending (nulls first) or descending
    (nulls last), as Iceberg's sort orders default."""

    column: str
    descending: bool = False

    def __str__(self) -> str:
        return f"{self.column} desc" if self.descending else self.column


SORT_KEY = re.compile(r"^\s*(?P<col>[A-Za-z_][A-Za-z0-9_]*)(?:\s+(?P<dir>asc|desc))?\s*$", re.IGNORECASE)


def parse_sort(text: str) -> SortKey | None:
    """``col``, ``col asc`` or ``col desc`` as a sort key; None if it is not one."""
    match = SORT_KEY.match(text)
    if match is None:
        return None
    return SortKey(match.group("col"), (match.group("dir") or "asc").lower() == "desc")


@dataclass(frozen=True)
class Transform:
    """One ``partition_by`` item, parsed."""

    function: str  # identity | year | month | day | hour | bucket | truncate
    column: str
    width: int | None = None  # bucket count or truncate width

    @property
    def field_name(self) -> str:
        """The partition field's name, as Iceberg's own tools name it."""
        if self.width is not None:
            return f"{self.column}_{self.function}_{self.width}"
        return self.column if self.function == "identity" else f"{self.column}_{self.function}"


def parse_transform(text: str) -> Transform | None:
    """``text`` as a transform; None if it is not one."""
    match = TRANSFORM.match(text.replace(" ", ""))
    if match is None:
        return None
    width = match.group("n")
    return Transform(
        match.group("fn") or match.group("wfn") or "identity",
        match.group("col") or match.group("wcol") or match.group("bare"),
        int(width) if width is not None else None,
    )
