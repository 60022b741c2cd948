"""The tables' Iceberg schemas and partition specs, derived from :mod:`ingest.records`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _pyarrow_to_schema_without_ids
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

from ingest import records
from ingest.config import FieldSpec
from ingest.errors import TableMismatch


def _iceberg_schema(arrow: pa.Schema) -> Schema:
    """An Arrow schema from :mod:`ingest.records` as an Iceberg schema, field ids assigned as
    Iceberg assigns fresh ones (top-level fields first, in order; then nested ones)."""
    return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(arrow))


def rows_schema(fields: Sequence[FieldSpec]) -> Schema:
    return _iceberg_schema(records.rows_schema(fields, docs=True))


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
        fields.append(
            PartitionField(
                source_id=source.field_id,
                field_id=1000 + i,
                transform=_TRANSFORMS[transform.function](transform.width),
                name=transform.field_name,
            )
        )
    return PartitionSpec(*fields)


def check_compatible(identifier: str, table: Table, schema: Schema) -> None:
    try:
        _check_pyarrow_schema_compatible(table.schema(), schema.as_arrow())
    except ValueError as error:
        raise TableMismatch(
            f"table {identifier} exists with a schema that does not fit the configured one: {error}\n"
            "Fix `schema:` to match the table, or evolve the table's schema first."
        ) from None
