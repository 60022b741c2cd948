"""Debezium change events in a registry format (Avro, as Debezium's Avro converter writes them):
the table's columns are the ``after`` record's, they evolve with it, and the events decode into
changes as JSON events do."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml

from ingest.changes import DELETE, UPSERT
from ingest.config import load
from ingest.errors import SchemaAhead, SchemaChangeRefused
from ingest.fields import evolved
from ingest.formats.avro import AvroDecoder
from ingest.formats.changelog import DebeziumChanges, debezium_fields, debezium_row
from ingest.formats.wire import Refused
from ingest.records import Declared, Field
from tests.unit.test_avro import Registry, chunk, framed
from tests.unit.test_changelog_decoding import SALLY, SOURCE, changes
from tests.unit.test_config import minimal, write

VALUE: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "first_name", "type": "string"},
        {"name": "last_name", "type": "string"},
        {"name": "email", "type": "string"},
    ],
    "connect.name": "dbserver1.inventory.customers.Value",
}


def envelope(value: dict[str, Any]) -> dict[str, Any]:
    """The envelope schema Debezium's MySQL connector registers through the Avro converter."""
    source = {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.mysql",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {
                "name": "snapshot",
                "type": [{"type": "string", "connect.name": "io.debezium.data.Enum"}, "null"],
                "default": "false",
            },
            {"name": "db", "type": "string"},
            {"name": "table", "type": ["null", "string"], "default": None},
            {"name": "server_id", "type": "long"},
            {"name": "gtid", "type": ["null", "string"], "default": None},
            {"name": "file", "type": "string"},
            {"name": "pos", "type": "long"},
            {"name": "row", "type": "int"},
            {"name": "thread", "type": ["null", "long"], "default": None},
            {"name": "query", "type": ["null", "string"], "default": None},
        ],
    }
    block = {
        "type": "record",
        "name": "block",
        "namespace": "event",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "dbserver1.inventory.customers",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
            {"name": "transaction", "type": ["null", block], "default": None},
        ],
        "connect.name": "dbserver1.inventory.customers.Envelope",
    }


V1 = envelope(VALUE)
V2 = envelope({**VALUE, "fields": [*VALUE["fields"], {"name": "phone", "type": ["null", "string"], "default": None}]})
AVRO_SOURCE = {k: v for k, v in SOURCE.items() if k != "sequence"}


def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    return {"before": before, "after": after, "source": AVRO_SOURCE, "op": op, "ts_ms": 1486500577691}


def decoder(fields: Sequence[Declared], registry: Registry) -> DebeziumChanges:
    events = AvroDecoder(debezium_fields(fields, wrapped=False), registry, "evolve", {}, debezium_row)
    return DebeziumChanges(events, ("id",))


def table_fields(registry: Registry) -> list[Field]:
    return debezium_row(AvroDecoder.writer_fields(registry.latest("dbserver1.inventory.customers-value")))


def test_the_tables_columns_are_the_after_records_fields() -> None:
    fields = table_fields(Registry((1, V1)))
    assert [(f.name, f.type) for f in fields] == [
        ("id", "int"),
        ("first_name", "string"),
        ("last_name", "string"),
        ("email", "string"),
    ]


def test_avro_events_become_their_changes_as_json_events_do() -> None:
    registry = Registry((1, V1))
    renamed = {**SALLY, "email": "sally@acme.com"}
    moved = {**renamed, "id": 2001}
    events = [
        event("r", None, SALLY),  # 0: the snapshot read it
        event("u", SALLY, renamed),  # 1
        event("u", renamed, moved),  # 2: its key changed
        event("d", moved, None),  # 3
        None,  # 4: the tombstone after the delete
        event("c", None, SALLY),  # 5: created again
        event("t", None, None),  # 6: a truncate
    ]
    values = [framed(1, V1, e) if e is not None else None for e in events]
    decoded = decoder(table_fields(registry), registry).decode(chunk(values))
    assert sorted(changes(decoded)) == [
        (0, UPSERT, 1001, "sally.thomas@acme.com"),
        (1, UPSERT, 1001, "sally@acme.com"),
        (2, DELETE, 1001, None),
        (2, UPSERT, 2001, "sally@acme.com"),
        (3, DELETE, 2001, None),
        (5, UPSERT, 1001, "sally.thomas@acme.com"),
    ]
    dead = dict(zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True))
    assert list(dead) == [6] and "'t'" in dead[6]
    assert not {"before", "after", "op", "source"} & set(decoded.rows.column_names)


def test_a_column_added_to_the_after_record_evolves_the_table_and_lands() -> None:
    registry = Registry((1, V1), (2, V2))
    fields: list[Declared] = list(table_fields(Registry((1, V1))))
    phoned = {**SALLY, "phone": "+1 555 0100"}
    values: list[bytes | None] = [framed(1, V1, event("c", None, SALLY)), framed(2, V2, event("u", SALLY, phoned))]
    with pytest.raises(SchemaAhead) as ahead:
        decoder(fields, registry).decode(chunk(values))
    assert ahead.value.schema_ids == (2,)

    fields = evolved(fields, [registry.schemas[2]], {}, row=debezium_row)
    assert [f.name for f in fields] == ["id", "first_name", "last_name", "email", "phone"]
    decoded = decoder(fields, registry).decode(chunk(values))
    assert decoded.dead_letters.num_rows == 0
    assert decoded.rows["phone"].to_pylist() == [None, "+1 555 0100"]


def test_a_writer_schema_that_is_no_debezium_event_stops_the_batch_saying_so() -> None:
    registry = Registry((1, V1), (3, VALUE))
    values: list[bytes | None] = [framed(3, VALUE, SALLY)]
    with pytest.raises(SchemaChangeRefused, match=r"schema id 3 cannot be a table's schema: .*not a Debezium change"):
        decoder(table_fields(Registry((1, V1))), registry).decode(chunk(values))


def test_an_after_that_is_no_record_is_refused() -> None:
    broken = copy.deepcopy(V1)
    broken["fields"][0] = {"name": "before", "type": ["null", "string"]}
    broken["fields"][1] = {"name": "after", "type": ["null", "string"]}
    with pytest.raises(Refused, match="'after' field is a string"):
        debezium_row(AvroDecoder.writer_fields(Registry((1, broken)).latest("")))


def test_plain_avro_events_of_a_schema_file_give_the_after_records_columns_and_decode(tmp_path: Path) -> None:
    """Without a registry (``schema_file:``, the envelope's schema), the table's columns are the
    after record's too, and the events decode into their changes."""
    from ingest.engines.task_spec import TaskSpec
    from ingest.fields import from_schema_file

    (tmp_path / "customers.avsc").write_text(json.dumps(V1))
    data = minimal()
    del data["schema"]
    data["topics"] = [{"name": "orders", "format": "avro", "schema_file": "customers.avsc"}]
    data["changes"] = {"envelope": "debezium", "key": ["id"]}
    config = load(write(tmp_path, yaml.safe_dump(data)))
    fields = from_schema_file(config)
    assert fields is not None and [f.name for f in fields] == ["id", "first_name", "last_name", "email"]

    bodies: list[bytes | None] = []
    for e in (event("c", None, SALLY), event("d", SALLY, None)):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(copy.deepcopy(V1)), e)
        bodies.append(out.getvalue())
    decoded = TaskSpec.of(config, fields).decoder().decode(chunk(bodies))
    assert sorted(changes(decoded)) == [(0, UPSERT, 1001, "sally.thomas@acme.com"), (1, DELETE, 1001, None)]
