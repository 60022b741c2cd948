"""Changelogs in the registry formats on Apache Kafka and a real Schema Registry (Apicurio): Debezium
change events in Avro, JSON Schema and Protobuf, written by confluent-kafka's own serializers as
Debezium's converters write them; the table's columns are the subject's ``after`` record, a column
added there evolves the table in the batch's own snapshot, and the table is the fold of the changes.
And an upsert topic whose keys are Avro records: a tombstone deletes the row its key's fields name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from confluent_kafka.schema_registry import ConfigCompatibilityLevel, SchemaRegistryClient, ServerConfig
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.assembly import open_pipeline
from ingest.kafka.admin import produce
from ingest.kafka.registry import REQUEST_TIMEOUT_S
from tests.integration.conftest import Env, KafkaRecord, MakeEnv
from tests.integration.test_changelog import debezium_stream, fold, table_rows
from tests.services.apicurio import Apicurio
from tests.unit.test_changelog_registry import AVRO_SOURCE, envelope

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]

Event = dict[str, Any]
#: a record's value from an event, and the schema version (1; 2 adds ``phone`` to the row)
Serialize = Callable[[Event, int], bytes]
SOURCE = {"connector": "mysql", "db": "inventory", "ts_ms": 1486500577000}


def _client(registry: Apicurio, subject: str) -> SchemaRegistryClient:
    client = SchemaRegistryClient({"url": registry.url, "timeout": REQUEST_TIMEOUT_S})
    client.set_config(subject_name=subject, config=ServerConfig(compatibility=ConfigCompatibilityLevel.NONE))
    return client


def _with_phone(event: Event, version: int) -> Event:
    """``event`` as a writer of ``version`` sends it: with version 2, each image has a phone."""
    out = {**event, "source": SOURCE}
    if version == 2:
        for image in ("before", "after"):
            if out[image] is not None:
                out[image] = {**out[image], "phone": f"+1 555 {out[image]['id']:04d}"}
    return out


# --- Avro: the envelope Debezium's Avro converter registers ---------------------------------------


def _avro_envelope(version: int) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "email", "type": "string"},
        {"name": "visits", "type": "long"},
    ]
    if version == 2:
        fields.append({"name": "phone", "type": ["null", "string"], "default": None})
    return envelope({"type": "record", "name": "Value", "fields": fields})


def avro(registry: Apicurio, topic: str) -> Serialize:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    client = _client(registry, f"{topic}-value")
    context = SerializationContext(topic, MessageField.VALUE)
    serializers = {
        v: AvroSerializer(client, json.dumps(_avro_envelope(v)), conf={"auto.register.schemas": True}) for v in (1, 2)
    }
    return lambda event, version: serializers[version]({**_with_phone(event, version), "source": AVRO_SOURCE}, context)


# --- JSON Schema: the envelope Confluent's JSON Schema converter registers ------------------------


def _json_envelope(version: int) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "id": {"type": "integer", "connect.type": "int64"},
        "email": {"type": "string"},
        "visits": {"type": "integer", "connect.type": "int64"},
    }
    if version == 2:
        properties["phone"] = {"oneOf": [{"type": "null"}, {"type": "string"}]}
    value = {"type": "object", "title": "dbserver1.inventory.customers.Value", "properties": properties}
    value["required"] = ["id", "email", "visits"]
    source = {
        "type": "object",
        "title": "io.debezium.connector.mysql.Source",
        "properties": {"connector": {"type": "string"}, "db": {"type": "string"}, "ts_ms": {"type": "integer"}},
    }
    return {
        "type": "object",
        "title": "dbserver1.inventory.customers.Envelope",
        "properties": {
            "before": {"oneOf": [{"type": "null"}, value]},
            "after": {"oneOf": [{"type": "null"}, value]},
            "source": source,
            "op": {"type": "string"},
            "ts_ms": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
        },
        "required": ["source", "op"],
    }


def json_schema(registry: Apicurio, topic: str) -> Serialize:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    client = _client(registry, f"{topic}-value")
    context = SerializationContext(topic, MessageField.VALUE)
    serializers = {
        v: JSONSerializer(json.dumps(_json_envelope(v)), client, conf={"auto.register.schemas": True}) for v in (1, 2)
    }
    return lambda event, version: serializers[version](_with_phone(event, version), context)


# --- Protobuf: the envelope Confluent's Protobuf converter registers ------------------------------


def protobuf(registry: Apicurio, topic: str) -> Serialize:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message_factory import GetMessageClass

    kind = descriptor_pb2.FieldDescriptorProto

    def envelope_class(version: int) -> Any:
        file = descriptor_pb2.FileDescriptorProto(
            name=f"customers_v{version}.proto", package="dbserver1.inventory.customers", syntax="proto3"
        )
        value = file.message_type.add(name="Value")
        value.field.add(name="id", number=1, type=kind.TYPE_INT64, label=kind.LABEL_OPTIONAL)
        value.field.add(name="email", number=2, type=kind.TYPE_STRING, label=kind.LABEL_OPTIONAL)
        value.field.add(name="visits", number=3, type=kind.TYPE_INT64, label=kind.LABEL_OPTIONAL)
        if version == 2:
            value.field.add(name="phone", number=4, type=kind.TYPE_STRING, label=kind.LABEL_OPTIONAL)
        source = file.message_type.add(name="Source")
        source.field.add(name="connector", number=1, type=kind.TYPE_STRING, label=kind.LABEL_OPTIONAL)
        source.field.add(name="db", number=2, type=kind.TYPE_STRING, label=kind.LABEL_OPTIONAL)
        source.field.add(name="ts_ms", number=3, type=kind.TYPE_INT64, label=kind.LABEL_OPTIONAL)
        envelope = file.message_type.add(name="Envelope")
        image = ".dbserver1.inventory.customers.Value"
        envelope.field.add(name="before", number=1, type=kind.TYPE_MESSAGE, type_name=image, label=kind.LABEL_OPTIONAL)
        envelope.field.add(name="after", number=2, type=kind.TYPE_MESSAGE, type_name=image, label=kind.LABEL_OPTIONAL)
        source_type = ".dbserver1.inventory.customers.Source"
        envelope.field.add(
            name="source", number=3, type=kind.TYPE_MESSAGE, type_name=source_type, label=kind.LABEL_OPTIONAL
        )
        envelope.field.add(name="op", number=4, type=kind.TYPE_STRING, label=kind.LABEL_OPTIONAL)
        pool = DescriptorPool()
        pool.Add(file)
        return GetMessageClass(pool.FindMessageTypeByName("dbserver1.inventory.customers.Envelope"))

    client = _client(registry, f"{topic}-value")
    context = SerializationContext(topic, MessageField.VALUE)
    classes = {v: envelope_class(v) for v in (1, 2)}
    serializers = {v: ProtobufSerializer(classes[v], client, {"use.deprecated.format": False}) for v in (1, 2)}

    def serialize(event: Event, version: int) -> bytes:
        data = _with_phone(event, version)
        images = {image: data[image] for image in ("before", "after") if data[image] is not None}  # else unset
        framed: bytes = serializers[version](classes[version](op=data["op"], source=data["source"], **images), context)
        return framed

    return serialize


FORMATS: dict[str, Callable[[Apicurio, str], Serialize]] = {
    "avro": avro,
    "json_schema": json_schema,
    "protobuf": protobuf,
}


def registry_changelog(make_env: MakeEnv, registry: Apicurio, format: str, **changes: Any) -> Env:
    """A two-partition topic of customers' changes in ``format`` and its pipeline: no ``schema:``,
    the table's columns from the registry's subject."""
    env = make_env(partitions=2, schema=None, partition_by=[], batch={"max_records": 500, "read_timeout_s": 20})
    data = yaml.safe_load(env.config_path.read_text())
    data.pop("schema", None)
    data["topics"] = [{"name": env.topic, "format": format}]
    data["schema_registry"] = {"url": registry.url}
    data["changes"] = {"envelope": "debezium", "key": ["id"], **changes}
    env.config_path.write_text(yaml.safe_dump(data))
    return env


def send(env: Env, serialize: Serialize, events: list[tuple[int, Event | None]], version: int) -> None:
    """``events`` into the topic, a key's in partition ``key mod 2``; the tombstone after a delete too."""
    records: list[KafkaRecord] = [
        (key % env.partitions, str(key).encode(), serialize(e, version) if e is not None else None, [])
        for key, e in events
    ]
    produce(env.bootstrap, env.topic, records)  # type: ignore[arg-type]


@pytest.mark.parametrize("format", sorted(FORMATS))
def test_debezium_events_in_a_registry_format_land_as_the_fold_and_a_new_column_evolves_the_table(
    make_env: MakeEnv, registry: Apicurio, format: str
) -> None:
    env = registry_changelog(make_env, registry, format)
    serialize = FORMATS[format](registry, env.topic)
    events = debezium_stream(2_000, 250, seed=31)
    send(env, serialize, events[:1_000], version=1)
    first = env.cli("run", "--until-caught-up")
    assert first.returncode == 0, first.stderr

    table = open_pipeline(env.config).rows.table
    columns = [f.name for f in table.schema().fields if not f.name.startswith("_kafka_")]
    assert columns == ["id", "email", "visits"]  # the after record's: not before, op, source
    assert table_rows(env) == fold(events[:1_000])
    snapshots = len(table.metadata.snapshots)

    send(env, serialize, events[1_000:], version=2)  # the row gains a column
    second = env.cli("run", "--until-caught-up")
    assert second.returncode == 0, second.stderr

    table = open_pipeline(env.config).rows.table
    assert [f.name for f in table.schema().fields if not f.name.startswith("_kafka_")] == [*columns, "phone"]
    evolving = table.metadata.snapshots[snapshots]  # the first batch of version 2 carries the new schema
    assert evolving.schema_id == table.metadata.current_schema_id
    assert table_rows(env) == fold(events)
    newest: dict[int, int] = {}  # each live key's newest change: by position in the stream
    for at, (key, event) in enumerate(events):
        if event is not None:
            newest[key] = at
    phones = {r["id"]: r["phone"] for r in table.scan(selected_fields=("id", "phone")).to_arrow().to_pylist()}
    assert phones == {k: f"+1 555 {k:04d}" if newest[k] >= 1_000 else None for k in fold(events)}
    env.verify()


def test_a_debezium_subject_whose_after_lacks_the_key_column_is_a_config_error(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    env = registry_changelog(make_env, registry, "avro", key=["customer_id"])
    send(env, avro(registry, env.topic), debezium_stream(20, 5, seed=1), version=1)
    result = env.cli("run")
    assert result.returncode == 78, result.stderr
    assert "changes.key: ['customer_id'] not in the latest schema of the topics' subjects" in result.stderr
    assert "after record of a Debezium event" in result.stderr


def test_an_upsert_topic_with_avro_keys_deletes_the_row_its_tombstones_key_names(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """A compacted topic keyed by an Avro record (``{id}``), its values Avro rows: a tombstone's key
    is decoded through the registry, and its ``id`` field names the row it deletes."""
    from confluent_kafka.schema_registry.avro import AvroSerializer

    env = make_env(partitions=2, schema=None, partition_by=[], batch={"max_records": 400, "read_timeout_s": 20})
    data = yaml.safe_load(env.config_path.read_text())
    data.pop("schema", None)
    data["topics"] = [{"name": env.topic, "format": "avro", "key_format": "avro"}]
    data["schema_registry"] = {"url": registry.url}
    data["changes"] = {"envelope": "upsert", "key": ["id"]}
    env.config_path.write_text(yaml.safe_dump(data))
    key_schema = {"type": "record", "name": "Key", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
    row_schema = {
        "type": "record",
        "name": "Customer",
        "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "email", "type": "string"},
            {"name": "visits", "type": "long"},
        ],
    }
    keys = AvroSerializer(_client(registry, f"{env.topic}-key"), json.dumps(key_schema))
    values = AvroSerializer(_client(registry, f"{env.topic}-value"), json.dumps(row_schema))
    key_context = SerializationContext(env.topic, MessageField.KEY)
    value_context = SerializationContext(env.topic, MessageField.VALUE)

    events = debezium_stream(2_000, 250, seed=37)
    records: list[KafkaRecord] = []
    for key, event in events:
        if event is None:
            continue  # (Debezium's tombstone after a delete: an upsert topic's delete is the tombstone alone)
        value = values(event["after"], value_context) if event["op"] != "d" else None
        records.append((key % env.partitions, keys({"id": key}, key_context), value, []))  # type: ignore[arg-type]
    produce(env.bootstrap, env.topic, records)  # type: ignore[arg-type]

    result = env.cli("run", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert table_rows(env) == fold(events)
    deleted = {key for key, event in events if event is not None and event["op"] == "d"} - set(fold(events))
    assert deleted, "the stream deletes keys for good"
    env.verify()
