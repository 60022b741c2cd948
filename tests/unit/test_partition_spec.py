"""``partition_by`` against the columns' types, and an existing table's spec against the config's."""

from __future__ import annotations

import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, VoidTransform

from ingest.errors import ConfigError
from ingest.iceberg.schema import partition_spec, rows_schema, spec_difference
from ingest.records import Field

FIELDS = [Field("order_id", "long", True), Field("page", "string"), Field("created_at", "timestamptz")]


def test_a_transform_the_columns_type_does_not_take_is_refused_naming_both() -> None:
    schema = rows_schema(FIELDS)
    with pytest.raises(ConfigError, match=r"'day\(page\)': day cannot partition page, a string column"):
        partition_spec(schema, ["day(page)"])
    assert partition_spec(schema, ["bucket(4, page)", "day(created_at)", "order_id"]).fields


def test_the_same_spec_under_a_renamed_column_or_with_a_dropped_v1_field_is_no_difference() -> None:
    table = rows_schema(FIELDS)
    spec = partition_spec(table, ["day(created_at)"])
    renamed = rows_schema([*FIELDS[:2], Field("created", "timestamptz")])

    assert (
        spec_difference(table, spec, renamed, partition_spec(renamed, ["day(created)"]), {"created_at": "created"})
        is None
    )
    assert spec_difference(table, spec, renamed, partition_spec(renamed, ["day(created)"])) == (
        "the table is partitioned by [day(created_at)], the config says [day(created)]"
    )
    source = table.find_field("created_at").field_id
    dropped = PartitionSpec(PartitionField(source, 1000, VoidTransform(), "created_at_day"))  # format v1 after a drop
    assert spec_difference(table, dropped, table, partition_spec(table, [])) is None
    moved = PartitionSpec(PartitionField(source, 1000, DayTransform(), "created_at_day"))
    assert spec_difference(table, moved, table, partition_spec(table, [])) is not None
