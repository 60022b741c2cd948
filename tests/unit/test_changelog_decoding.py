"""Debezium change events as Debezium's JSON converter writes them, decoded into changes."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from ingest.changes import DELETE, OP, UPSERT, from_tombstones
from ingest.config import FieldSpec
from ingest.formats.changelog import DebeziumChanges, UpsertChanges, debezium_fields
from ingest.formats.json import Decoder
from ingest.formats.keys import StringKeys
from ingest.records import Decoded, Field
from tests.unit.test_decode import chunk
from tests.unit.test_keys import chunk as key_chunk

CUSTOMERS = [
    FieldSpec(name="id", type="int", required=True),
    FieldSpec(name="first_name", type="string"),
    FieldSpec(name="last_name", type="string"),
    FieldSpec(name="email", type="string"),
]
SALLY = {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "sally.thomas@acme.com"}
#: what Debezium's MySQL connector says of an event's source (the tutorial's inventory database)
SOURCE = {
    "version": "2.7.0.Final", "connector": "mysql", "name": "dbserver1", "ts_ms": 1486500577000, "snapshot": "false",
    "db": "inventory", "table": "customers", "server_id": 223344, "gtid": None, "file": "mysql-bin.000003",
    "pos": 364, "row": 0, "thread": 3, "query": None,
}  # fmt: skip


def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    return {"before": before, "after": after, "source": SOURCE, "op": op, "ts_ms": 1486500577691, "transaction": None}


def with_schema(payload: dict[str, Any]) -> dict[str, Any]:
    """The JSON converter's value with ``schemas.enable=true``: the event under ``payload``."""
    row = {"type": "struct", "optional": True, "name": "dbserver1.inventory.customers.Value", "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        *({"type": "string", "optional": c != "email", "field": c} for c in ("first_name", "last_name", "email")),
    ]}  # fmt: skip
    schema = {"type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"}, {"type": "string", "optional": False, "field": "op"},
    ]}  # fmt: skip
    return {"schema": schema, "payload": payload}


def decode(values: list[dict[str, Any] | None], key: tuple[str, ...] = ("id",)) -> Decoded:
    raw = [json.dumps(v).encode() if v is not None else None for v in values]
    return DebeziumChanges(Decoder(debezium_fields(CUSTOMERS, wrapped=True)), key).decode(chunk(raw))


def changes(decoded: Decoded, value: str = "email") -> list[tuple[int, str, int, str | None]]:
    """Each change's offset, kind, key (``id``) and ``value`` column."""
    rows = decoded.rows
    return list(
        zip(
            rows["_kafka_offset"].to_pylist(),
            rows[OP].to_pylist(),
            rows["id"].to_pylist(),
            rows[value].to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("wrap", [lambda e: e, with_schema], ids=["schemas.enable=false", "schemas.enable=true"])
def test_a_row_read_created_updated_rekeyed_and_deleted_becomes_its_changes(wrap: Any) -> None:
    renamed = {**SALLY, "email": "sally@acme.com"}
    moved = {**renamed, "id": 2001}
    values = [
        wrap(event("r", None, SALLY)),  # 100: the snapshot read it
        wrap(event("u", SALLY, renamed)),  # 101
        wrap(event("u", renamed, moved)),  # 102: its key changed
        wrap(event("d", moved, None)),  # 103
        None,  # 104: the tombstone after the delete
        wrap(event("c", None, SALLY)),  # 105: created again
    ]
    decoded = decode(values)
    assert decoded.dead_letters.num_rows == 0 and decoded.unknown == 0
    assert sorted(changes(decoded)) == [
        (100, UPSERT, 1001, "sally.thomas@acme.com"),
        (101, UPSERT, 1001, "sally@acme.com"),
        (102, DELETE, 1001, None),
        (102, UPSERT, 2001, "sally@acme.com"),
        (103, DELETE, 2001, None),
        (105, UPSERT, 1001, "sally.thomas@acme.com"),
    ]
    assert set(decoded.rows.column_names) >= {"_kafka_topic", "_kafka_partition", "_kafka_offset", "first_name"}
    assert not {"before", "after", "op", "payload", "source"} & set(decoded.rows.column_names)


def test_both_converter_settings_in_one_topic_decode_alike() -> None:
    decoded = decode([event("c", None, SALLY), with_schema(event("u", SALLY, {**SALLY, "email": "s@acme.com"}))])
    assert sorted(changes(decoded)) == [(100, UPSERT, 1001, "sally.thomas@acme.com"), (101, UPSERT, 1001, "s@acme.com")]


def test_an_event_that_changes_no_keyed_row_is_a_dead_letter_saying_why() -> None:
    values = [
        event("c", None, SALLY),  # 100
        event("t", None, None),  # 101: a truncate
        event("d", None, None),  # 102: a delete without its before image (REPLICA IDENTITY not FULL)
        event("c", None, {**SALLY, "id": None}),  # 103
        {"not": "an event"},  # 104
    ]
    raw: list[bytes | None] = [*(json.dumps(v).encode() for v in values), b"{not json"]  # 105
    decoded = DebeziumChanges(Decoder(debezium_fields(CUSTOMERS, wrapped=True)), ("id",)).decode(chunk(raw))
    assert changes(decoded) == [(100, UPSERT, 1001, "sally.thomas@acme.com")]
    dead = dict(zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True))
    assert sorted(dead) == [101, 102, 103, 104, 105]
    assert "'t'" in dead[101] and "'before'" in dead[102] and "'id'" in dead[103]
    assert decoded.dead_letters["value"].to_pylist()[0] == raw[1]  # the raw value, as it came


def test_an_upsert_topics_values_upsert_and_its_tombstones_delete_the_key_they_name() -> None:
    fields = [Field("id", "long", True), Field("name", "string")]
    decoder = UpsertChanges(Decoder(fields), StringKeys(), ("id",), fields)
    values: list[bytes | None] = [
        b'{"id": 1, "name": "a"}',
        None,
        b'{"id": 2, "name": "b"}',
        None,
        None,
        b'{"name": "c"}',
    ]
    keys: list[bytes | None] = [b"1", b"1", b"2", b"two", b"\xff", b"3"]
    decoded = decoder.decode(key_chunk(keys, values))
    rows = decoded.rows
    assert (
        rows.column_names[-1] == OP
        and rows.column_names[:-1] == Decoder(fields).decode(key_chunk([], [])).rows.column_names
    )
    assert sorted(changes(decoded, "name")) == [(0, UPSERT, 1, "a"), (1, DELETE, 1, None), (2, UPSERT, 2, "b")]
    dead = dict(zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True))
    assert sorted(dead) == [3, 4, 5]
    assert "'two'" in dead[3] and "'id'" in dead[5]
    assert decoded.dead_letters["offset"].to_pylist() == [3, 4, 5]  # in the order of their records


def test_a_tombstone_deletes_its_key_where_the_table_requires_every_column() -> None:
    """A delete has no value for the row's other columns, even required ones (a registry subject's
    non-null fields): its change carries nulls there, and the key alone."""
    fields = [Field("id", "long", True), Field("name", "string", True)]
    decoder = UpsertChanges(Decoder(fields), StringKeys(), ("id",), fields)
    decoded = decoder.decode(key_chunk([b"1", b"1"], [b'{"id": 1, "name": "a"}', None]))
    assert sorted(changes(decoded, "name")) == [(0, UPSERT, 1, "a"), (1, DELETE, 1, None)]


def test_a_tombstones_structured_key_names_the_key_columns_by_field() -> None:
    """A registry key format's key is a record: its fields give the key columns of the same name
    (cast to their types); a tombstone whose key lacks one, or has it null, deletes nothing."""
    others = pa.table({"_kafka_offset": pa.array([0, 1, 2], pa.int64())})
    kind = pa.struct([("tenant", pa.string()), ("id", pa.int32()), ("extra", pa.string())])
    keys = pa.array([{"tenant": "a", "id": 7}, {"tenant": "b", "id": None}, {"tenant": "c", "id": 9}], kind)
    row = pa.schema([("tenant", pa.string()), ("id", pa.int64()), ("name", pa.string())])

    deletes, why = from_tombstones(others, keys, ("tenant", "id"), row)

    assert deletes.to_pylist() == [
        {"_kafka_offset": 0, "tenant": "a", "id": 7, "name": None, OP: DELETE},
        {"_kafka_offset": 2, "tenant": "c", "id": 9, "name": None, OP: DELETE},
    ]
    assert deletes.schema.field("id").type == pa.int64()
    assert why == {1: "a tombstone whose key gives no 'id'"}
    lacking = pa.array([{"tenant": "a"}] * 3, pa.struct([("tenant", pa.string())]))
    none, why = from_tombstones(others, lacking, ("tenant", "id"), row)
    assert none.num_rows == 0 and why == dict.fromkeys(range(3), "the key has no field 'id'")


def test_an_upsert_topics_chunks_decode_to_one_schema_with_tombstones_or_without() -> None:
    """A task concatenates its chunks' changes: a chunk with tombstones has the columns and types of
    one without (the key column stays required: a tombstone naming no key is a dead letter)."""
    fields = [Field("id", "long", True), Field("name", "string")]
    decoder = UpsertChanges(Decoder(fields), StringKeys(), ("id",), fields)
    plain = decoder.decode(key_chunk([b"1"], [b'{"id": 1, "name": "a"}'])).rows
    mixed = decoder.decode(key_chunk([b"1", b"2"], [b'{"id": 1, "name": "A"}', None], first=1)).rows
    assert mixed.schema == plain.schema
    assert pa.concat_tables([plain, mixed])["id"].to_pylist() == [1, 1, 2]


def test_a_tasks_changes_are_folded_before_they_are_written() -> None:
    """Changes decoded chunk by chunk (``changes:``) are held until the last chunk, folded, and
    written once: each key's newest row if an upsert, and every key changed named for the commit."""
    from ingest.engines.tasks import decode_and_write
    from ingest.testing.memory_table import MemoryCatalog

    fields = [Field("id", "long", True), Field("name", "string")]
    decoder = UpsertChanges(Decoder(fields), StringKeys(), ("id",), fields)
    first = key_chunk(
        [b"1", b"2", b"3"], [b'{"id": 1, "name": "a"}', b'{"id": 2, "name": "b"}', b'{"id": 3, "name": "c"}']
    )
    second = key_chunk([b"1", b"2"], [b'{"id": 1, "name": "A"}', None], first=3)
    table = MemoryCatalog("lake.customers").table()

    produced = decode_and_write([first, second], decoder, table, write_rows=1, key=("id",))

    written = table.read_written([f.file_path for f in produced.files], ["_kafka_offset", "id", "name"])
    assert sorted(written.to_pylist(), key=lambda r: r["id"]) == [
        {"_kafka_offset": 3, "id": 1, "name": "A"},
        {"_kafka_offset": 2, "id": 3, "name": "c"},
    ]
    assert produced.deletes is not None and produced.deletes.key == ("id",)
    assert sorted(produced.deletes.keys["id"].to_pylist()) == [1, 2, 3]
    assert produced.records == 5 and produced.dead_letters.num_rows == 0


def test_a_tasks_decoder_reads_changes_as_the_config_says() -> None:
    """``changes:`` in a task's spec: Debezium events, or an upsert topic's rows and tombstones
    (with the decoded key beside them), each record a change of its key's row."""
    from ingest.engines.task_spec import TaskSpec
    from ingest.records import KEY_COLUMN

    fields = (
        Field("id", "int", True),
        Field("first_name", "string"),
        Field("last_name", "string"),
        Field("email", "string"),
    )
    spec = TaskSpec({}, ("customers",), "g", 1.0, fields, 100, changes=("debezium", ("id",)))
    values = [json.dumps(event("c", None, SALLY)).encode(), None, json.dumps(event("d", SALLY, None)).encode()]
    decoded = spec.decoder().decode(chunk(values))
    assert sorted(changes(decoded)) == [(100, UPSERT, 1001, "sally.thomas@acme.com"), (102, DELETE, 1001, None)]

    keyed = (*fields, Field(KEY_COLUMN, "string"))
    spec = TaskSpec({}, ("customers",), "g", 1.0, keyed, 100, key_format="string", changes=("upsert", ("id",)))
    values = [json.dumps(SALLY).encode(), None]
    decoded = spec.decoder().decode(chunk(values, keys=[b"1001", b"1001"]))
    assert sorted(changes(decoded)) == [(100, UPSERT, 1001, "sally.thomas@acme.com"), (101, DELETE, 1001, None)]
    assert decoded.rows[KEY_COLUMN].to_pylist() == ["1001", "1001"]
