"""``sort_by``: the Iceberg sort order it makes, what it refuses, and files written in its order."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ingest.errors import ConfigError
from ingest.iceberg.schema import rows_schema, sort_difference, sort_keys, sort_order, sorted_by
from ingest.records import Field, SortKey, parse_sort

SCHEMA = rows_schema([Field("customer", "long"), Field("at", "timestamptz"), Field("tags", "list<string>")])


def test_sort_keys_round_trip_through_the_table_sort_order() -> None:
    customer, at = parse_sort("customer"), parse_sort("at  DESC")
    assert customer is not None and at is not None
    keys = [customer, at]
    assert keys == [SortKey("customer"), SortKey("at", descending=True)]

    order = sort_order(SCHEMA, keys)

    assert [(str(f.direction), str(f.null_order)) for f in order.fields] == [
        ("ASC", "NULLS FIRST"),
        ("DESC", "NULLS LAST"),
    ]
    assert sort_keys(SCHEMA, order) == keys
    assert sort_difference(SCHEMA, order, keys) is None
    assert "the config's sort_by says [customer]" in (sort_difference(SCHEMA, order, keys[:1]) or "")


@pytest.mark.parametrize(
    ("key", "said"), [("tags", "is a list<string> column"), ("nope", "which the table does not have")]
)
def test_what_cannot_be_sorted_by_is_a_config_error(key: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        sort_order(SCHEMA, [SortKey(key)])


def test_not_a_sort_key() -> None:
    assert parse_sort("customer desc nulls first") is None and parse_sort("day(at)") is None


def test_files_are_written_in_the_order_nulls_first_ascending_last_descending() -> None:
    data = pa.table({"customer": [2, None, 1, 2, 2], "at": [1, 2, None, None, 4]})

    ascending = sorted_by(data, [SortKey("customer"), SortKey("at", descending=True)])
    descending = sorted_by(data, [SortKey("customer", descending=True)])

    assert ascending.to_pylist() == [
        {"customer": None, "at": 2},
        {"customer": 1, "at": None},
        {"customer": 2, "at": 4},
        {"customer": 2, "at": 1},
        {"customer": 2, "at": None},
    ]
    assert descending["customer"].to_pylist() == [2, 2, 2, 1, None]
