"""``changes:`` in a pipeline's config: what it takes, and what it refuses saying why."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ingest.config import parse
from tests.unit.test_config import error_of, minimal, routed_by_value


def changelog(**overrides: Any) -> dict[str, Any]:
    data = minimal()
    data["changes"] = {"envelope": "debezium", "key": ["order_id"]}
    data.update(overrides)
    return data


@pytest.mark.parametrize("format", ["json", "avro", "protobuf", "json_schema"])
def test_a_debezium_envelope_is_read_in_every_value_format(format: str) -> None:
    data = changelog(topics=[{"name": "orders", "format": format}])
    if format != "json":
        data["schema_registry"] = {"url": "http://registry:8081"}
        del data["schema"]  # the after record of the subject's envelope gives the columns
    config = parse(data, "p.yaml")
    assert config.changes is not None and config.changes.envelope == "debezium"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"changes": {"envelope": "debezium", "key": ["id"]}}, r"changes.key: \['id'\] not in schema"),
        ({"renames": {"amt": "amount"}}, "renames: a Debezium event's columns are inside its before and after"),
        ({"unknown_fields": "capture"}, "unknown_fields: a Debezium event's own fields"),
        ({"headers": True}, "headers: a changelog's rows do not carry"),
        ({"changes": {"envelope": "upsert", "key": ["order_id"]}}, "give the topics a key_format"),
    ],
)
def test_what_a_changelog_cannot_be_is_refused_saying_why(overrides: dict[str, Any], expected: str) -> None:
    message = error_of(changelog(**overrides))
    assert re.search(expected, message), message


def test_a_changelog_goes_to_one_table() -> None:
    data = routed_by_value()
    data["changes"] = {"envelope": "debezium", "key": ["order_id"]}
    assert "a changelog goes to one table; `route_by:` is not supported" in error_of(data)
