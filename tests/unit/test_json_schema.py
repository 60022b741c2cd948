"""The JSON Schema format: JSON Schemas mapped to table fields, and Confluent-framed JSON values
decoded into rows, poison records split off naming the cause (the registry is a dict here; the
integration suite runs Apicurio and confluent-kafka's JSONSerializer)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import SchemaAhead
from ingest.formats.json_schema import JsonSchemaDecoder, object_fields
from ingest.formats.wire import Refused
from ingest.ports import WriterSchema
from ingest.records import RawChunk

ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "amount": {"type": "number", "description": "in EUR"},
        "paid": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "note": {"type": ["null", "string"]},
        "address": {"$ref": "#/definitions/Address"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "coupon": {"oneOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["order_id", "amount", "note", "address"],
    "definitions": {
        "Address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}
    },
}


class Registry:
    def __init__(self, *schemas: tuple[int, dict[str, Any]]) -> None:
        self.schemas = {i: WriterSchema(i, "JSON", json.dumps(s)) for i, s in schemas}

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self.schemas.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        return self.schemas[max(self.schemas)]


def framed(schema_id: int, value: Any) -> bytes:
    return struct.pack(">bI", 0, schema_id) + json.dumps(value).encode()


def chunk(values: list[bytes | None]) -> RawChunk:
    n = len(values)
    return RawChunk(
        pa.array(["t"] * n),
        pa.array([0] * n, pa.int32()),
        pa.array(range(100, 100 + n), pa.int64()),
        pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, pa.binary()),
        values,
        lambda i: None,
        0,
    )


def test_json_schemas_map_to_table_fields() -> None:
    fields = {f.name: (f.type, f.required) for f in object_fields(json.dumps(ORDER))}

    assert fields == {
        "order_id": ("long", True),
        "amount": ("double", True),
        "paid": ("boolean", False),
        "created_at": ("timestamptz", False),
        "day": ("date", False),
        "note": ("string", False),  # required, but null is allowed
        "address": ("struct<city: string, zip: long>", True),
        "tags": ("list<string>", False),
        "coupon": ("string", False),
    }
    assert next(f.doc for f in object_fields(json.dumps(ORDER)) if f.name == "amount") == "in EUR"


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "type(s) string, integer"),
        ({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, "anyOf"),
        ({"type": "object", "properties": {"a": {"type": "object"}}}, "an object without properties"),
        ({"type": "object", "properties": {"a": {"$ref": "other.json#/X"}}}, "the registry holds no reference for"),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}, "the schema's root refers to"),
        ({"type": "array", "items": {"type": "integer"}}, "not an object with properties"),
    ],
)
def test_what_has_no_table_form_is_refused_saying_why(schema: dict[str, Any], says: str) -> None:
    with pytest.raises(Refused, match=says.replace("(", r"\(").replace(")", r"\)")):
        object_fields(json.dumps(schema))


def test_framed_json_decodes_into_rows_and_poison_into_dead_letters() -> None:
    decoder = JsonSchemaDecoder(object_fields(json.dumps(ORDER)), Registry((3, ORDER)), "evolve")
    good = {"order_id": 1, "amount": 2.5, "note": None, "address": {"city": "c", "zip": 7}, "tags": ["a"]}
    values: list[bytes | None] = [
        framed(3, good),
        framed(3, {**good, "order_id": 2}),
        struct.pack(">bI", 0, 3) + b'{"order_id": ',
        json.dumps(good).encode(),
        framed(3, {**good, "order_id": "three"}),
        framed(9, good),
        framed(3, {**good, "order_id": 4, "created_at": "2026-12-01T10:00:00Z"}),
    ]

    decoded = decoder.decode(chunk(values))

    rows = decoded.rows.select(["_kafka_offset", "order_id", "address", "created_at"]).to_pylist()
    assert [(r["_kafka_offset"], r["order_id"]) for r in rows] == [(100, 1), (101, 2), (106, 4)]
    assert rows[0]["address"] == {"city": "c", "zip": 7}
    errors = dict(
        zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True)
    )
    assert sorted(errors) == [102, 103, 104, 105]
    assert errors[102].startswith("not valid JSON") and errors[102].endswith("(schema id 3)")
    assert errors[103].startswith("wrong magic byte 0x7b (it looks like JSON)")
    assert "field 'order_id'" in errors[104]
    assert errors[105] == "unknown schema id 9: the Schema Registry has no such schema"
    assert decoded.dead_letters["value"].to_pylist()[0] == values[2]  # the raw value, prefix and all


def test_a_writer_schema_with_a_new_property_asks_the_table_to_evolve() -> None:
    wider = json.loads(json.dumps(ORDER))
    wider["properties"]["channel"] = {"type": "string"}
    decoder = JsonSchemaDecoder(object_fields(json.dumps(ORDER)), Registry((3, ORDER), (4, wider)), "evolve")

    with pytest.raises(SchemaAhead) as ahead:
        decoder.decode(chunk([framed(4, {"order_id": 1, "amount": 1, "note": None, "address": {}})]))
    assert ahead.value.schema_ids == (4,)


def test_refs_into_referenced_documents_resolve_with_those_documents_own_local_refs() -> None:
    street = {"$defs": {"Street": {"type": "object", "properties": {"name": {"type": "string"}}}}}
    address = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "street": {"$ref": "street.json#/$defs/Street"}},
    }
    order = {
        "type": "object",
        "properties": {"order_id": {"type": "integer"}, "ship_to": {"$ref": "address.json"}},
    }
    street_schema = WriterSchema(20, "JSON", json.dumps(street))
    address_schema = WriterSchema(21, "JSON", json.dumps(address), (("street.json", street_schema),))

    fields = {f.name: f.type for f in object_fields(json.dumps(order), (("address.json", address_schema),))}

    assert fields == {"order_id": "long", "ship_to": "struct<city: string, street: struct<name: string>>"}
