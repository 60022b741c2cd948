"""The tables' Iceberg schemas and partition specs, derived from :mod:`ingest.records`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import ResolveError, ValidationError
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _pyarrow_to_schema_without_ids
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Transaction
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import DecimalType, FixedType, IcebergType, ListType, MapType, StructType

from ingest import records, type_names
from ingest.errors import ConfigError, TableMismatch


def _iceberg_schema(arrow: pa.Schema) -> Schema:
    """An Arrow schema from :mod:`ingest.records` as an Iceberg schema, field ids assigned as
    Iceberg assigns fresh ones (top-level fields first, in order; then nested ones)."""
    return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(arrow))


def rows_schema(fields: Sequence[records.Declared]) -> Schema:
    return _iceberg_schema(records.rows_schema(fields, docs=True))


def _type_name(kind: IcebergType) -> str:
    """An Iceberg type as the type string ``schema:`` declares it with."""
    if isinstance(kind, DecimalType):
        return f"decimal({kind.precision},{kind.scale})"
    if isinstance(kind, StructType):
        return "struct<" + ", ".join(f"{f.name}: {_type_name(f.field_type)}" for f in kind.fields) + ">"
    if isinstance(kind, ListType):
        return f"list<{_type_name(kind.element_type)}>"
    if isinstance(kind, MapType):
        return f"map<{_type_name(kind.key_type)}, {_type_name(kind.value_type)}>"
    if isinstance(kind, FixedType):
        return "binary"
    name = str(kind)
    if name not in type_names.PRIMITIVE_TYPES:
        raise TableMismatch(f"the table has a column of type {name}, which this version does not write")
    return name


def declared_fields(schema: Schema, only: Collection[str] | None = None) -> list[records.Field]:
    """The rows table's fields as ``schema:`` would declare them (the Kafka columns left out; with
    ``only``, just those named so)."""
    return [
        records.Field(f.name, _type_name(f.field_type), f.required, f.doc)
        for f in schema.fields
        if f.name not in records.RESERVED_COLUMNS and (only is None or f.name in only)
    ]


def dead_letter_schema() -> Schema:
    return _iceberg_schema(records.DEAD_LETTER_SCHEMA)


_TRANSFORMS: dict[str, Callable[[int | None], Transform[Any, Any]]] = {
    "identity": lambda _: IdentityTransform(),
    "year": lambda _: YearTransform(),
    "month": lambda _: MonthTransform(),
    "day": lambda _: DayTransform(),
    "hour": lambda _: HourTransform(),
    "bucket": lambda n: BucketTransform(n or 0),
    "truncate": lambda n: TruncateTransform(n or 0),
}


def partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    if not partition_by:
        return UNPARTITIONED_PARTITION_SPEC
    fields = []
    for i, item in enumerate(partition_by):
        transform = records.parse_transform(item)
        assert transform is not None  # validated in config
        source = schema.find_field(transform.column)
        function = _TRANSFORMS[transform.function](transform.width)
        if not function.can_transform(source.field_type):
            raise ConfigError(
                f"partition_by: {item!r}: {transform.function} cannot partition {transform.column}, a "
                f"{source.field_type} column ({_TRANSFORM_TYPES[transform.function]}). Nothing was created."
            )
        fields.append(
            PartitionField(source_id=source.field_id, field_id=1000 + i, transform=function, name=transform.field_name)
        )
    return PartitionSpec(*fields)


#: what each transform partitions, as Iceberg's spec says
_TRANSFORM_TYPES = {
    "identity": "any primitive column",
    "year": "date and timestamp columns",
    "month": "date and timestamp columns",
    "day": "date and timestamp columns",
    "hour": "timestamp columns",
    "bucket": "int, long, decimal, date, time, timestamp, string, binary and uuid columns",
    "truncate": "int, long, decimal, string and binary columns",
}


def described_spec(schema: Schema, spec: PartitionSpec, names: Mapping[str, str] | None = None) -> list[str]:
    """A partition spec as ``transform(column)`` items (columns renamed by ``names``); a dropped
    field of a format-v1 table (a ``void`` transform) partitions nothing and is left out."""
    shown = []
    for f in spec.fields:
        if isinstance(f.transform, VoidTransform):
            continue
        name = schema.find_column_name(f.source_id) or str(f.source_id)
        shown.append(f"{f.transform}({(names or {}).get(name, name)})")
    return shown


def stage_spec(transaction: Transaction, schema: Schema, spec: PartitionSpec, wanted: PartitionSpec) -> None:
    """Stage in ``transaction`` what turns partition spec ``spec`` into ``wanted`` (fields of
    ``schema``): the fields it lacks added, those it has beyond removed."""

    def key(f: PartitionField) -> tuple[int, str]:
        return f.source_id, str(f.transform)

    live = [f for f in spec.fields if not isinstance(f.transform, VoidTransform)]
    keep = {key(f) for f in wanted.fields}
    update = transaction.update_spec()
    for f in live:
        if key(f) not in keep:
            update.remove_field(f.name)
    have = {key(f) for f in live}
    for f in wanted.fields:
        column = schema.find_column_name(f.source_id)
        if key(f) not in have and column is not None:  # the wanted spec is of this schema
            update.add_field(column, f.transform, f.name)
    update.commit()


def spec_difference(
    table: Schema,
    spec: PartitionSpec,
    wanted_schema: Schema,
    wanted: PartitionSpec,
    renames: Mapping[str, str] | None = None,
) -> str | None:
    """How an existing table's partition spec differs from the configured one (None: it does not),
    by source column (under its new name, where ``renames`` renames it) and transform; a dropped
    field of a format-v1 table (a ``void`` transform) partitions nothing."""

    have, want = described_spec(table, spec, renames or {}), described_spec(wanted_schema, wanted)
    if sorted(have) == sorted(want):  # the order of the fields does not change what a spec partitions by
        return None
    return f"the table is partitioned by [{', '.join(have)}], the config says [{', '.join(want)}]"


def sort_order(schema: Schema, keys: Sequence[records.SortKey]) -> SortOrder:
    """``sort_by`` as an Iceberg sort order of ``schema``'s top-level columns (ascending with nulls
    first, descending with nulls last, as Iceberg defaults)."""
    if not keys:
        return UNSORTED_SORT_ORDER
    fields = []
    for key in keys:
        try:
            source = schema.find_field(key.column)
        except ValueError:
            raise ConfigError(
                f"sort_by: {str(key)!r} refers to {key.column!r}, which the table does not have"
            ) from None
        if not source.field_type.is_primitive:
            raise ConfigError(
                f"sort_by: {str(key)!r}: {key.column} is a {source.field_type} column; sort by a column of a "
                "primitive type (a number, a string, a date or time, ...)"
            )
        direction = SortDirection.DESC if key.descending else SortDirection.ASC
        nulls = NullOrder.NULLS_LAST if key.descending else NullOrder.NULLS_FIRST
        fields.append(
            SortField(source_id=source.field_id, transform=IdentityTransform(), direction=direction, null_order=nulls)
        )
    return SortOrder(*fields)


def sort_keys(schema: Schema, order: SortOrder, names: Mapping[str, str] | None = None) -> list[records.SortKey] | None:
    """A table's sort order as sort keys of its top-level columns (renamed by ``names``); None if it
    sorts by something else (a transform, a nested column, nulls not where Iceberg's default puts
    them), which files written here cannot follow."""
    keys = []
    for f in order.fields:
        name = schema.find_column_name(f.source_id)
        descending = f.direction == SortDirection.DESC
        nulls = NullOrder.NULLS_LAST if descending else NullOrder.NULLS_FIRST
        if not isinstance(f.transform, IdentityTransform) or name is None or "." in name or f.null_order != nulls:
            return None
        keys.append(records.SortKey((names or {}).get(name, name), descending))
    return keys


def sort_difference(
    schema: Schema, order: SortOrder, wanted: Sequence[records.SortKey], renames: Mapping[str, str] | None = None
) -> str | None:
    """How an existing table's sort order differs from ``sort_by`` (None: it does not), its
    columns under their new names where ``renames`` renames them."""
    have = sort_keys(schema, order, renames)
    shown = [str(k) for k in have] if have is not None else [str(f) for f in order.fields]
    if have == list(wanted):
        return None
    return f"the table is sorted by [{', '.join(shown)}], the config's sort_by says [{', '.join(map(str, wanted))}]"


def stage_evolution(
    transaction: Transaction, identifier: str, wanted: Schema, renames: Mapping[str, str] | None = None
) -> bool:
    """Stage in ``transaction`` what makes its table's schema take records of ``wanted``, after
    renaming its top-level columns by ``renames`` (old name → new; a column keeps its field id, so
    rows written before read under the new name); True if that changes the schema.

    Allowed, as Iceberg allows them without rewriting data: new optional columns (nested ones
    too), widening (int→long, float→double, decimal precision), required→optional. Columns are
    matched by name to their field ids; a new column gets the next id, so two writers evolving the
    same table the same way assign the same ids. A column the table has and ``wanted`` lacks stays
    (optional ones are written as nulls). Anything else (a narrower or different type, a new
    required column, a required column missing) raises :class:`TableMismatch`: the table is left
    as it is."""
    current = transaction.table_metadata.schema()
    names = set(current.column_names)
    pending = {old: new for old, new in (renames or {}).items() if old in names and new not in names}
    clash = sorted(old for old, new in (renames or {}).items() if old in names and new in names)
    if clash:
        pairs = ", ".join(f"{old} and {(renames or {})[old]}" for old in clash)
        raise TableMismatch(
            f"table {identifier} has both {pairs}, so `renames:` cannot rename one to the other (records of the new "
            "name already landed in a column of their own). Drop the rename from the config, or merge the columns "
            "with your engine first."
        )
    if pending:
        with transaction.update_schema() as rename:  # staged; the union below sees the new names
            for old, new in pending.items():
                rename.rename_column(old, new)
    update = transaction.update_schema()
    try:
        update.union_by_name(wanted)
        evolved = update._apply()
    except (ValueError, ValidationError, ResolveError) as error:
        raise TableMismatch(
            f"table {identifier} cannot take the configured schema: {error}. Only new optional columns, "
            "widened types (int→long, float→double, larger decimal precision) and required→optional evolve "
            "with a batch; fix `schema:`, or change the table with your engine's ALTER TABLE first."
        ) from None
    try:  # by name, as writes are matched (the ids in ``wanted`` are its own, fresh ones)
        _check_pyarrow_schema_compatible(evolved, _without_ids(wanted.as_arrow()))
    except ValueError as error:
        raise TableMismatch(
            f"table {identifier} exists with a schema that does not fit the configured one: {error}\n"
            "Fix `schema:` to match the table, or evolve the table's schema first."
        ) from None
    if evolved == transaction.table_metadata.schema():
        return bool(pending)
    update.commit()  # staged in the transaction: committed with whatever else it holds
    return True


def _without_ids(schema: pa.Schema) -> pa.Schema:
    """``schema`` with no field metadata (so no field ids) at any depth."""

    def plain(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(kind):
            return pa.struct([pa.field(f.name, plain(f.type), f.nullable) for f in kind])
        if pa.types.is_map(kind):
            item = kind.item_field
            return pa.map_(
                pa.field("key", plain(kind.key_type), False), pa.field("value", plain(item.type), item.nullable)
            )
        if pa.types.is_list(kind):
            element = kind.value_field
            return pa.list_(pa.field(element.name, plain(element.type), element.nullable))
        return kind

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def describe_change(before: Schema, after: Schema) -> str:
    """What an evolution changes, for the log: ``added note (string); amount: required→optional``."""
    old = {f.field_id: f for f in before.fields}
    parts = []
    for field in after.fields:
        was = old.get(field.field_id)
        if was is None:
            parts.append(f"added {field.name} ({field.field_type})")
        elif was != field:
            if was.name != field.name:
                parts.append(f"renamed {was.name} to {field.name}")
            if was.required and not field.required:
                parts.append(f"{field.name}: required→optional")
            if was.field_type != field.field_type:
                parts.append(f"{field.name}: {was.field_type}→{field.field_type}")
    return "; ".join(parts) or "nested columns"


def sorted_by(data: pa.Table, keys: Sequence[records.SortKey]) -> pa.Table:
    """``data`` in the order of ``keys`` (the columns it has): ascending with nulls first,
    descending with nulls last, as Iceberg's sort orders default."""
    order = [
        (k.column, "descending", "at_end") if k.descending else (k.column, "ascending", "at_start")
        for k in keys
        if k.column in data.column_names
    ]
    return data.take(pc.sort_indices(data, sort_keys=order)) if order else data
