"""The Avro format: the mapping of writer schemas to table fields, and decoding framed values into
rows (with poison records split off). Values are written by fastavro, as confluent-kafka's
serializer writes them; the registry is a dict here (the integration suite runs Apicurio)."""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
import struct
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from ingest.errors import SchemaAhead, SchemaChangeRefused
from ingest.formats.avro import AvroDecoder, AvroFileDecoder
from ingest.formats.avro_schema import record_fields
from ingest.formats.wire import Refused
from ingest.ports import WriterSchema
from ingest.records import RawChunk


class Registry:
    def __init__(self, *schemas: tuple[int, dict[str, Any]]) -> None:
        self.schemas = {i: WriterSchema(i, "AVRO", json.dumps(s)) for i, s in schemas}

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self.schemas.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        return self.schemas[max(self.schemas)]


def record(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


def framed(schema_id: int, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def chunk(values: list[bytes | None]) -> RawChunk:
    n = len(values)
    return RawChunk(
        pa.array(["t"] * n),
        pa.array([0] * n, pa.int32()),
        pa.array(range(n), pa.int64()),
        pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, pa.binary()),
        values,
        lambda i: None,
        sum(len(v or b"") for v in values),
    )


ADDRESS = record("Address", ("city", "string"), ("zip", ["null", "int"]))
ORDER = record(
    "Order",
    ("id", "long"),
    ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    ("price", {"type": "fixed", "name": "P", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4}),
    ("day", {"type": "int", "logicalType": "date"}),
    ("at", {"type": "long", "logicalType": "timestamp-millis"}),
    ("local", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ("t", {"type": "int", "logicalType": "time-millis"}),
    ("ref", {"type": "string", "logicalType": "uuid"}),
    ("note", ["null", "string"]),
    ("address", ADDRESS),
    ("billing", ["Address", "null"]),
    ("tags", {"type": "array", "items": ["null", "string"]}),
    ("attrs", {"type": "map", "values": "long"}),
    ("status", {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}),
    ("history", {"type": "array", "items": {"type": "enum", "name": "Step", "symbols": ["A", "B"]}}),
    ("raw", "bytes"),
    ("hash", {"type": "fixed", "name": "H", "size": 4}),
    ("ratio", "float"),
    ("flag", "boolean"),
)


def test_writer_schemas_map_to_table_fields_as_documented() -> None:
    fields = {f.name: (f.type, f.required) for f in record_fields(json.dumps(ORDER))}

    assert fields == {
        "id": ("long", True),
        "amount": ("decimal(10,2)", True),
        "price": ("decimal(18,4)", True),
        "day": ("date", True),
        "at": ("timestamptz", True),
        "local": ("timestamp", True),
        "t": ("time", True),
        "ref": ("string", True),
        "note": ("string", False),
        "address": ("struct<city: string, zip: int>", True),
        "billing": ("struct<city: string, zip: int>", False),
        "tags": ("list<string>", True),
        "attrs": ("map<string, long>", True),
        "status": ("string", True),
        "history": ("list<string>", True),
        "raw": ("binary", True),
        "hash": ("binary", True),
        "ratio": ("float", True),
        "flag": ("boolean", True),
    }


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (record("R", ("a", ["null", "string", "long"])), "a union of several types (string, long)"),
        (record("Node", ("next", ["null", "Node"])), "record 'Node' contains itself"),
        (record("R", ("a", "null")), "always null has no Iceberg type"),
        (record("R", ("a", {"type": "bytes", "logicalType": "decimal", "precision": 40})), "beyond Iceberg's 38"),
        ({"type": "array", "items": "long"}, "not a record"),
        (record("R", ("_kafka_offset", "long")), "the pipeline adds a column of that name"),
    ],
)
def test_what_has_no_table_form_is_refused_saying_why(schema: Any, says: str) -> None:
    with pytest.raises(Refused, match=says.replace("(", r"\(").replace(")", r"\)")):
        record_fields(json.dumps(schema))


def order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "amount": Decimal("12.34"),
        "price": Decimal("1.5000"),
        "day": dt.date(2026, 12, 1),
        "at": dt.datetime(2026, 12, 1, 10, 0, 0, 123000, tzinfo=dt.UTC),
        "local": dt.datetime(2026, 12, 1, 10, 0, 0, 7),
        "t": dt.time(1, 2, 3, 4000),
        "ref": "8d4b6f3e-5d7a-4c2b-9a51-0b1e3c3f9d11",
        "note": None if i % 2 else f"n{i}",
        "address": {"city": "c", "zip": i},
        "billing": None if i % 3 else {"city": "b", "zip": None},
        "tags": ["x", None][: i % 3],
        "attrs": {"w": i},
        "status": "PAID",
        "history": ["B", "A"],
        "raw": b"\x00\x01",
        "hash": b"abcd",
        "ratio": 0.5,
        "flag": True,
    }


def test_a_chunk_decodes_into_rows_of_the_table_with_every_type() -> None:
    decoder = AvroDecoder(record_fields(json.dumps(ORDER)), Registry((7, ORDER)), "evolve")

    decoded = decoder.decode(chunk([framed(7, ORDER, order(i)) for i in range(6)]))

    assert decoded.dead_letters.num_rows == 0
    rows = decoded.rows.to_pylist()
    for i, row in enumerate(rows):
        expected = order(i)
        assert {k: row[k] for k in expected if k != "attrs"} == {k: v for k, v in expected.items() if k != "attrs"}
        assert dict(row["attrs"]) == expected["attrs"]
        assert row["_kafka_offset"] == i


def test_records_of_an_older_writer_schema_fill_the_new_fields_with_nulls() -> None:
    old = record("O", ("id", "int"), ("address", record("A", ("city", "string"))))
    new = record("O", ("id", "long"), ("address", ADDRESS), ("note", ["null", "string"]))
    decoder = AvroDecoder(record_fields(json.dumps(new)), Registry((1, old), (2, new)), "fail")

    values: list[bytes | None] = [
        framed(1, old, {"id": 1, "address": {"city": "a"}}),
        framed(2, new, order(2) | {"address": {"city": "b", "zip": 9}}),
    ]
    rows = decoder.decode(chunk(values)).rows.select(["id", "address", "note"]).to_pylist()

    assert rows == [
        {"id": 1, "address": {"city": "a", "zip": None}, "note": None},
        {"id": 2, "address": {"city": "b", "zip": 9}, "note": "n2"},
    ]


def test_a_newer_writer_schema_asks_for_evolution_or_is_refused_or_set_aside() -> None:
    old = record("O", ("id", "long"))
    new = record("O", ("id", "long"), ("note", ["null", "string"]))
    values: list[bytes | None] = [framed(1, old, {"id": 1}), framed(2, new, {"id": 2, "note": "x"})]
    table = record_fields(json.dumps(old))

    with pytest.raises(SchemaAhead) as ahead:
        AvroDecoder(table, Registry((1, old), (2, new)), "evolve").decode(chunk(values))
    assert ahead.value.schema_ids == (2,) and ahead.value.first == (("t", 0, 1),)
    assert "(the first: t[0] at offset 1)" in str(ahead.value)
    rebuilt = SchemaAhead(f"a Spark task of batch 3 failed: {ahead.value}")  # as Spark rebuilds it from the text
    assert (rebuilt.schema_ids, rebuilt.first) == ((2,), (("t", 0, 1),))
    again = pickle.loads(pickle.dumps(ahead.value))  # as it leaves a worker process
    assert (again.schema_ids, again.first) == ((2,), (("t", 0, 1),))
    with pytest.raises(SchemaChangeRefused, match="schema id 2 adds note"):
        AvroDecoder(table, Registry((1, old), (2, new)), "fail").decode(chunk(values))
    decoded = AvroDecoder(table, Registry((1, old), (2, new)), "dead_letter").decode(chunk(values))
    assert decoded.rows.column("id").to_pylist() == [1]
    assert decoded.dead_letters.column("error").to_pylist() == [
        "schema id 2 adds note, which the table does not have (on_schema_change: dead_letter)"
    ]


def test_a_type_iceberg_cannot_follow_stops_the_batch_unless_set_aside() -> None:
    old = record("O", ("id", "long"))
    new = record("O", ("id", "string"))
    values: list[bytes | None] = [framed(2, new, {"id": "x"})]
    table = record_fields(json.dumps(old))

    with pytest.raises(SchemaChangeRefused, match="id: the table has long, the records string"):
        AvroDecoder(table, Registry((2, new)), "evolve").decode(chunk(values))
    decoded = AvroDecoder(table, Registry((2, new)), "dead_letter").decode(chunk(values))
    assert decoded.rows.num_rows == 0 and decoded.dead_letters.num_rows == 1


def test_poison_values_become_dead_letters_naming_the_cause() -> None:
    good = [framed(7, ORDER, order(i)) for i in range(40)]
    values: list[bytes | None] = list(good)
    values[3] = None
    values[5] = b'{"id": 5}'
    values[8] = b"\x00\x00"
    values[13] = good[13][:-3]
    values[21] = b"\x00" + (99).to_bytes(4, "big") + good[21][5:]
    values[30] = b"\x00" + (8).to_bytes(4, "big") + good[30][5:]
    registry = Registry((7, ORDER))
    registry.schemas[8] = WriterSchema(8, "PROTOBUF", "syntax = 'proto3'; message M {}")
    decoder = AvroDecoder(record_fields(json.dumps(ORDER)), registry, "evolve")

    decoded = decoder.decode(chunk(values))

    errors = dict(
        zip(
            decoded.dead_letters.column("offset").to_pylist(),
            decoded.dead_letters.column("error").to_pylist(),
            strict=True,
        )
    )
    assert sorted(errors) == [3, 5, 8, 13, 21, 30]
    assert "tombstone" in errors[3]
    assert errors[5].startswith("wrong magic byte 0x7b (it looks like JSON)")
    assert errors[8].startswith("value is 2 bytes")
    assert errors[13].startswith("does not decode as Avro with schema id 7")
    assert errors[21] == "unknown schema id 99: the Schema Registry has no such schema"
    assert errors[30] == "written with a PROTOBUF schema (id 8); this topic is read as Avro"
    assert decoded.rows.column("id").to_pylist() == [i for i in range(40) if i not in errors]


def test_many_values_cut_short_are_each_a_dead_letter_and_lengthened_ones_land_as_their_record() -> None:
    """A chunk with poison every few records: the values that are not a record of their schema are
    found in one pass (no bisection down to each), each a dead letter once saying so; a value with
    bytes after its record is that record, as confluent-kafka's deserializer reads it."""
    good = [framed(7, ORDER, order(i)) for i in range(300)]
    values: list[bytes | None] = list(good)
    short, long = set(range(0, 300, 7)), set(range(3, 300, 11)) - set(range(0, 300, 7))
    for i in short:
        values[i] = good[i][:-2]
    for i in long:
        values[i] = good[i] + b"\x00\x01"
    decoder = AvroDecoder(record_fields(json.dumps(ORDER)), Registry((7, ORDER)), "evolve")

    decoded = decoder.decode(chunk(values))

    errors = dict(
        zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True)
    )
    assert sorted(errors) == sorted(short)
    assert all("cut short" in errors[i] for i in short)
    assert decoded.rows.column("id").to_pylist() == [i for i in range(300) if i not in short]
    assert decoded.rows.column("raw").to_pylist() == [b"\x00\x01"] * (300 - len(short))


def test_a_record_short_of_its_schema_that_still_decodes_misaligned_is_caught() -> None:
    """A value one byte short (its last field, an empty string, lost) reads that byte from the next
    value's prefix; the next value, read one byte late, happens to end where it really ends (its
    two-byte id read as a one-byte one), and the block decodes without an error, records 2 and 3
    wrong. The prefixes read back show it."""
    schema = record("R", ("id", "long"), ("name", "string"))
    ids = [0, 1, 2, 300, 4, 5]
    encoded = [framed(3, schema, {"id": i, "name": ""}) for i in ids]
    values: list[bytes | None] = list(encoded)
    values[2] = encoded[2][:-1]
    decoder = AvroDecoder(record_fields(json.dumps(schema)), Registry((3, schema)), "evolve")

    decoded = decoder.decode(chunk(values))

    assert decoded.dead_letters.column("offset").to_pylist() == [2]
    assert decoded.rows.column("id").to_pylist() == [0, 1, 300, 4, 5]


def plain(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def test_plain_avro_bodies_of_a_schema_file_decode_and_a_misaligned_one_is_caught() -> None:
    """Without a prefix to read back, each value is followed by its position in the block, and the
    positions must come back in order: a value one byte short is set apart alone, its neighbours
    land. (Here the reader itself fails on the shifted bytes; in 20,000 random truncations tried,
    none decoded silently, so the position check is a second line of defence.)"""
    schema = record("R", ("id", "long"), ("name", "string"))
    ids = [0, 1, 2, 300, 4, 5]
    encoded = [plain(schema, {"id": i, "name": ""}) for i in ids]
    values: list[bytes | None] = list(encoded)
    values[2] = encoded[2][:-1]
    values[4] = None
    decoder = AvroFileDecoder(record_fields(json.dumps(schema)), json.dumps(schema))

    decoded = decoder.decode(chunk(values))

    assert decoded.rows.column("id").to_pylist() == [0, 1, 300, 5]
    errors = dict(
        zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True)
    )
    assert errors[2].startswith("does not decode as Avro with the schema file's schema")
    assert errors[4].startswith("value is null (a tombstone)")
    every = AvroFileDecoder(record_fields(json.dumps(ORDER)), json.dumps(ORDER)).decode(
        chunk([plain(ORDER, order(i)) for i in range(5)])
    )
    assert every.dead_letters.num_rows == 0 and every.rows.column("id").to_pylist() == list(range(5))


def test_named_types_of_referenced_schemas_resolve_and_decode() -> None:
    """A schema registered with references (Confluent's Avro references): ``shop.Payment`` names
    ``shop.Money`` from another subject, which names ``shop.Currency`` from a third."""
    currency = {"type": "enum", "name": "Currency", "namespace": "shop", "symbols": ["EUR", "USD"]}
    money = {"type": "record", "name": "Money", "namespace": "shop",
             "fields": [{"name": "currency", "type": "shop.Currency"}, {"name": "units", "type": "long"}]}  # fmt: skip
    payment = {"type": "record", "name": "Payment", "namespace": "shop",
               "fields": [{"name": "payment_id", "type": "long"}, {"name": "total", "type": "shop.Money"}]}  # fmt: skip
    money_schema = WriterSchema(
        31, "AVRO", json.dumps(money), (("shop.Currency", WriterSchema(30, "AVRO", json.dumps(currency))),)
    )
    paid = WriterSchema(32, "AVRO", json.dumps(payment), (("shop.Money", money_schema),))
    named: dict[str, Any] = {}
    for schema in (currency, money, payment):
        whole = fastavro.parse_schema(schema, named)
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, 32))
    fastavro.schemaless_writer(out, whole, {"payment_id": 5, "total": {"currency": "USD", "units": 12}})

    class One:
        def by_id(self, schema_id: int) -> WriterSchema | None:
            return paid if schema_id == 32 else None

        def latest(self, subject: str) -> WriterSchema:
            return paid

    fields = record_fields(paid.text, paid.references)
    rows = AvroDecoder(fields, One(), "fail").decode(chunk([out.getvalue()])).rows.to_pylist()

    assert {f.name: f.type for f in fields} == {"payment_id": "long", "total": "struct<currency: string, units: long>"}
    assert rows[0]["total"] == {"currency": "USD", "units": 12}
    with pytest.raises(Refused, match=r"unknown type 'shop\.Money'"):
        record_fields(paid.text)


def test_a_renamed_field_reads_under_the_tables_name_and_a_writer_with_both_names_by_the_new_one() -> None:
    from ingest.records import Field, renamed

    old = record("Line", ("id", "long"), ("qty", "int"))
    both = record("Line", ("id", "long"), ("qty", "int"), ("quantity", "int"))
    fields = [Field("id", "long", True), Field("quantity", "int", True)]
    renames = {"qty": "quantity"}
    decoder = AvroDecoder(fields, Registry((1, old), (2, both)), "fail", renames)

    rows = decoder.decode(
        chunk([framed(1, old, {"id": 1, "qty": 5}), framed(2, both, {"id": 2, "qty": 0, "quantity": 7})])
    )

    assert rows.rows.select(["id", "quantity"]).to_pylist() == [{"id": 1, "quantity": 5}, {"id": 2, "quantity": 7}]
    assert [f.name for f in renamed(record_fields(json.dumps(both)), renames)] == ["id", "quantity"]  # no qty column
