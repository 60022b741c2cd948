"""Record keys decoded into ``_kafka_key_decoded`` (``key_format:``): UTF-8 strings, and registry
formats (an Avro record key as a struct, an Avro primitive key as its type), beside values of any
format; a key that does not decode makes its record a dead letter saying so, a null key reads as
null, and a newer key writer schema asks for the key column to evolve."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from ingest.errors import SchemaAhead
from ingest.formats.avro import AvroDecoder
from ingest.formats.decoders import key_field
from ingest.formats.json import Decoder
from ingest.formats.keys import KeyedDecoder, RegistryKeys, StringKeys, value_fields
from ingest.ports import WriterSchema
from ingest.records import KEY_COLUMN, Field, RawChunk

FIELDS = [Field("id", "long", True), Field("name", "string")]


def chunk(keys: list[bytes | None], values: list[bytes | None], first: int = 0) -> RawChunk:
    n = len(values)
    return RawChunk(
        pa.array(["t"] * n),
        pa.array([0] * n, pa.int32()),
        pa.array(range(first, first + n), pa.int64()),
        pa.array([0] * n, pa.timestamp("us", tz="UTC")),
        pa.array(keys, pa.binary()),
        values,
        lambda i: None,
        sum(len(v or b"") for v in values),
    )


def avro(schema_id: int, schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


class Registry:
    def __init__(self, *schemas: tuple[int, Any]) -> None:
        self.schemas = {i: WriterSchema(i, "AVRO", json.dumps(s)) for i, s in schemas}

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self.schemas.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        return self.schemas[max(self.schemas)]


def keyed(fields: list[Field], keys: Any) -> KeyedDecoder:
    return KeyedDecoder(fields, Decoder(value_fields(fields)), keys)


def test_string_keys_land_beside_the_values_and_one_that_is_not_utf8_is_a_dead_letter() -> None:
    fields = [*FIELDS[:1], Field(KEY_COLUMN, "string"), *FIELDS[1:]]  # the table's order is kept
    values: list[bytes | None] = [b'{"id": %d, "name": "n%d"}' % (i, i) for i in range(4)]

    decoded = keyed(fields, StringKeys()).decode(chunk([b"a", None, b"\xff\xfe", "ü".encode()], values))

    rows = decoded.rows
    assert rows.column_names[5:] == ["id", KEY_COLUMN, "name"]
    assert rows.select(["id", KEY_COLUMN]).to_pylist() == [
        {"id": 0, KEY_COLUMN: "a"},
        {"id": 1, KEY_COLUMN: None},
        {"id": 3, KEY_COLUMN: "ü"},
    ]
    assert rows.column("_kafka_key").to_pylist() == [b"a", None, "ü".encode()]
    (dead,) = decoded.dead_letters.to_pylist()
    assert dead["offset"] == 2 and dead["error"].startswith("key: not UTF-8 text")
    assert dead["key"] == b"\xff\xfe" and dead["value"] == values[2]


KEY_V1 = {
    "type": "record",
    "name": "Key",
    "fields": [{"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}],
}


def test_avro_record_keys_are_a_struct_and_their_poison_and_value_poison_are_dead_letters_each() -> None:
    key = key_field(WriterSchema(1, "AVRO", json.dumps(KEY_V1)))
    assert key == Field(KEY_COLUMN, "struct<tenant: string, id: long>", False)
    fields = [*FIELDS, key]
    decoder = keyed(fields, RegistryKeys(key, Registry((1, KEY_V1)), AvroDecoder, "fail"))
    keys: list[bytes | None] = [avro(1, KEY_V1, {"tenant": "a", "id": i}) for i in range(4)]
    keys[1] = None
    keys[2] = b"\x00\x00\x00\x00\x09xx"  # an id the registry does not know
    values: list[bytes | None] = [b'{"id": %d}' % i for i in range(4)]
    values[3] = b"not json"

    decoded = decoder.decode(chunk(keys, values))

    assert decoded.rows.select(["id", KEY_COLUMN]).to_pylist() == [
        {"id": 0, KEY_COLUMN: {"tenant": "a", "id": 0}},
        {"id": 1, KEY_COLUMN: None},
    ]
    errors = dict(zip(*(decoded.dead_letters.column(c).to_pylist() for c in ("offset", "error")), strict=True))
    assert errors[2] == "key: unknown schema id 9: the Schema Registry has no such schema"
    assert not errors[3].startswith("key:")


def test_a_primitive_avro_key_is_a_column_of_its_type_and_a_wider_writer_asks_to_evolve() -> None:
    key = key_field(WriterSchema(1, "AVRO", '"int"'))
    assert key == Field(KEY_COLUMN, "int", False)
    fields = [*FIELDS, key]
    registry = Registry((1, "int"), (2, "long"))
    decoder = keyed(fields, RegistryKeys(key, registry, AvroDecoder, "evolve"))
    values: list[bytes | None] = [b'{"id": 1}', b'{"id": 2}']

    rows = decoder.decode(chunk([avro(1, "int", 7), avro(1, "int", -3)], values)).rows

    assert rows.column(KEY_COLUMN).to_pylist() == [7, -3]
    with pytest.raises(SchemaAhead) as ahead:
        decoder.decode(chunk([None, avro(1, "int", 7), avro(2, "long", 2**40)], [*values, b'{"id": 3}'], first=100))
    assert ahead.value.key and ahead.value.schema_ids == (2,)
    assert ahead.value.first == (("t", 0, 102),)  # where the record is, not where its key is among the keys
    assert str(ahead.value).startswith("record keys: ") and "(the first: t[0] at offset 102)" in str(ahead.value)
    widened = [*FIELDS, key_field(WriterSchema(2, "AVRO", '"long"'))]
    evolved = keyed(widened, RegistryKeys(widened[-1], registry, AvroDecoder, "evolve"))
    assert evolved.decode(chunk([avro(2, "long", 2**40)], values[:1])).rows.column(KEY_COLUMN).to_pylist() == [2**40]


def test_a_keys_schema_ahead_stays_one_across_processes() -> None:
    import pickle

    ahead = pickle.loads(
        pickle.dumps(SchemaAhead("record keys: records were written with schema id 4", (4,), key=True))
    )
    from_text = SchemaAhead(str(ahead))  # as Spark rebuilds it from the message

    assert (ahead.key, ahead.schema_ids) == (True, (4,)) == (from_text.key, from_text.schema_ids)
    assert not SchemaAhead("records were written with schema id 4").key
    spark = SchemaAhead(f"a Spark task of batch 3 failed: {ahead}")  # as the Spark engine words it
    assert (spark.key, spark.schema_ids) == (True, (4,))


def test_protobuf_keys_are_a_struct_of_the_messages_fields() -> None:
    from ingest.formats.protobuf import ProtobufDecoder
    from tests.unit.test_protobuf import Registry as Protobufs
    from tests.unit.test_protobuf import classes_of_line, framed, line_file, writer

    line = writer(5, line_file())
    key = key_field(line)
    assert key == Field(KEY_COLUMN, "struct<id: long, sku: string, qty: int>", False)
    fields = [*FIELDS, key]
    decoder = keyed(fields, RegistryKeys(key, Protobufs(line), ProtobufDecoder, "fail"))
    message = classes_of_line()(id=3, sku="s", qty=2)

    rows = decoder.decode(chunk([framed(5, message, indexes=b"\x00")], [b'{"id": 1}'])).rows

    assert rows.column(KEY_COLUMN).to_pylist() == [{"id": 3, "sku": "s", "qty": 2}]


def test_an_optional_avro_record_key_is_read_as_the_struct_it_maps_to() -> None:
    """A key schema that is a union of null and a record (or a named type of another subject) reads
    as the record's struct, the same shape the column was derived with."""
    schema = ["null", KEY_V1]
    key = key_field(WriterSchema(3, "AVRO", json.dumps(schema)))
    assert key == Field(KEY_COLUMN, "struct<tenant: string, id: long>", False)
    fields = [*FIELDS, key]
    decoder = keyed(fields, RegistryKeys(key, Registry((3, schema)), AvroDecoder, "fail"))

    keys: list[bytes | None] = [avro(3, schema, {"tenant": "a", "id": 1}), avro(3, schema, None)]
    rows = decoder.decode(chunk(keys, [b'{"id": 1}', b'{"id": 2}'])).rows

    assert rows.column(KEY_COLUMN).to_pylist() == [{"tenant": "a", "id": 1}, None]
