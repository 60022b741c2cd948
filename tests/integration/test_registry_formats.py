"""Avro topics in the Confluent wire format, on Apache Kafka and a real Schema Registry (Apicurio
Registry, started for the module): the table's schema derived from the subject, nested types, a
writer schema that adds fields mid-stream (evolved in the batch's own snapshot), ``on_schema_change``,
poison records of each kind, and a registry that is down.

Records are written by confluent-kafka's own ``AvroSerializer`` against the registry, as a
producing service would write them.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
from decimal import Decimal
from typing import Any

import pyarrow.compute as pc
import pytest
import yaml
from confluent_kafka.schema_registry import ConfigCompatibilityLevel, SchemaRegistryClient, ServerConfig
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.schema import Schema as IcebergSchema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import StructType

from ingest.failpoints import POINTS
from ingest.iceberg.catalog import connect
from ingest.kafka.admin import produce
from ingest.kafka.registry import REQUEST_TIMEOUT_S
from tests.integration.conftest import Env, KafkaRecord, MakeEnv, summary_of
from tests.services.apicurio import Apicurio

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"])]

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "street", "type": ["null", "string"], "default": None}],
}
V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "address", "type": ADDRESS},
        {"name": "billing", "type": ["null", "Address"], "default": None},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "attributes", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": "int"},
    ],
}


def v2() -> dict[str, Any]:
    """V1 with a new optional field, a new nested field, and ``qty`` widened to long."""
    schema: dict[str, Any] = json.loads(json.dumps(V1))
    schema["fields"].append({"name": "coupon", "type": ["null", "string"], "default": None})
    address = schema["fields"][5]["type"]
    address["fields"].append({"name": "zip", "type": ["null", "int"], "default": None})
    schema["fields"][10]["type"] = "long"
    return schema


def order(i: int, version: int = 1) -> dict[str, Any]:
    value: dict[str, Any] = {
        "order_id": i,
        "amount": Decimal(f"{i % 1000}.25"),
        "created_at": dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "day": dt.date(2026, 12, 1 + i % 28),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "address": {"city": f"city-{i % 7}", "street": None if i % 2 else f"street {i}"},
        "billing": None if i % 3 else {"city": "billing", "street": None},
        "items": [f"sku-{j}" for j in range(i % 4)],
        "attributes": {"weight": i, "missing": None} if i % 5 else {},
        "note": None if i % 4 else f"note {i}",
        "qty": i % 100,
    }
    if version == 2:
        value["coupon"] = f"c{i}"
        value["address"]["zip"] = 10_000 + i
        value["qty"] = 2**40 + i
    return value


class Avro:
    """Writes orders as a producing service does: confluent-kafka's AvroSerializer, auto-registering."""

    def __init__(self, env: Env, registry: Apicurio, subject: str | None = None) -> None:
        self.env = env
        self.client = SchemaRegistryClient({"url": registry.url, "timeout": REQUEST_TIMEOUT_S})
        self.client.set_config(
            subject_name=subject or f"{env.topic}-value",
            config=ServerConfig(compatibility=ConfigCompatibilityLevel.NONE),
        )
        self.subject = subject
        self.context = SerializationContext(env.topic, MessageField.VALUE)

    def serializer(self, schema: dict[str, Any]) -> AvroSerializer:
        conf: dict[str, Any] = {"auto.register.schemas": True}
        if self.subject is not None:
            conf["subject.name.strategy"] = lambda ctx, name: self.subject
        serializer: AvroSerializer = AvroSerializer(self.client, json.dumps(schema), conf=conf)
        return serializer

    def produce(self, count: int, schema: dict[str, Any] = V1, version: int = 1) -> None:
        serializer = self.serializer(schema)
        start = self.env.produced
        records: list[KafkaRecord] = [
            (i % self.env.partitions, f"k{i}".encode(), serializer(order(i, version), self.context), [])
            for i in range(start, start + count)
        ]
        produce(self.env.bootstrap, self.env.topic, records)
        self.env.produced += count

    def raw(self, values: list[bytes | None]) -> None:
        start = self.env.produced
        records: list[KafkaRecord] = [(0, f"k{start + n}".encode(), value, []) for n, value in enumerate(values)]
        produce(self.env.bootstrap, self.env.topic, records)
        self.env.produced += len(values)


def avro_env(make_env: MakeEnv, registry: Apicurio, **overrides: Any) -> Env:
    env = make_env(partitions=2, schema=None, **{"partition_by": ["day(created_at)"], **overrides})
    data = yaml.safe_load(env.config_path.read_text())
    data["topics"] = [{"name": env.topic, "format": "avro"}]
    data["schema_registry"] = {"url": registry.url}
    data.pop("schema", None)
    env.config_path.write_text(yaml.safe_dump(data))
    return env


def _set(env: Env, **keys: Any) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    data.update(keys)
    env.config_path.write_text(yaml.safe_dump(data))


def _table(env: Env) -> Table:
    config = env.config
    return connect(config.catalog).load_table(config.table)


def _operation(snapshot: Snapshot) -> str:
    assert snapshot.summary is not None
    return snapshot.summary.operation.value


def _schema_of(table: Table, snapshot: Snapshot) -> IcebergSchema:
    """The schema ``snapshot`` was committed with."""
    assert snapshot.schema_id is not None
    schema = table.metadata.schema_by_id(snapshot.schema_id)
    assert schema is not None
    return schema


def _dead_letters(env: Env) -> list[dict[str, Any]]:
    config = env.config
    table = connect(config.catalog).load_table(config.dead_letters)
    return sorted(table.scan(selected_fields=("offset", "error")).to_arrow().to_pylist(), key=lambda r: r["offset"])


def test_an_avro_topic_with_nested_types_lands_and_a_new_writer_schema_evolves_the_table_with_its_batch(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    env = avro_env(make_env, registry, batch={"max_records": 1_000, "read_timeout_s": 20})
    writer = Avro(env, registry)
    writer.produce(1_500)

    first = env.cli("run", "--until-caught-up", "--json")

    assert first.returncode == 0, first.stderr
    table = _table(env)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["qty"] == "int" and types["status"] == "string" and types["amount"] == "decimal(12, 2)"
    assert types["attributes"].startswith("map<string, long>") or "map" in types["attributes"]
    assert table.schema().find_field("order_id").required and not table.schema().find_field("note").required
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(1_500))
    expected = order(1_234)
    got = next(r for r in rows if r["order_id"] == 1_234)
    assert got["amount"] == expected["amount"] and got["created_at"] == expected["created_at"]
    assert got["day"] == expected["day"] and got["status"] == expected["status"]
    assert got["address"] == expected["address"] and got["billing"] == expected["billing"]
    assert got["items"] == expected["items"] and dict(got["attributes"]) == expected["attributes"]
    assert got["note"] == expected["note"] and got["qty"] == expected["qty"]
    snapshots_before = len(table.metadata.snapshots)
    schema_before = table.metadata.current_schema_id

    writer.produce(700, v2(), version=2)  # the producing service deploys a new schema mid-stream
    second = env.cli("run", "--until-caught-up", "--json")

    assert second.returncode == 0, second.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == snapshots_before + 1  # one batch: data, ledger and schema together
    snapshot = table.metadata.snapshots[-1]
    assert snapshot.schema_id == table.metadata.current_schema_id != schema_before
    assert any(key.startswith("ingest.orders.") for key in summary_of(snapshot))
    schema = table.schema()
    assert str(schema.find_field("qty").field_type) == "long" and not schema.find_field("coupon").required
    assert schema.find_field("address.city").field_id == _field_id_before(env, schema_before, "address.city")
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(2_200))
    assert {r["coupon"] for r in rows[:1_500]} == {None} and {r["address"]["zip"] for r in rows[:1_500]} == {None}
    assert [r["coupon"] for r in rows[1_500:]] == [f"c{i}" for i in range(1_500, 2_200)]
    assert [r["address"]["zip"] for r in rows[1_500:]] == [10_000 + i for i in range(1_500, 2_200)]
    assert [r["qty"] for r in rows[1_500:]] == [2**40 + i for i in range(1_500, 2_200)]
    assert rows[5]["qty"] == 5  # old rows read through the widened column
    env.verify()


def _field_id_before(env: Env, schema_id: int, name: str) -> int:
    schema = next(s for s in _table(env).metadata.schemas if s.schema_id == schema_id)
    return schema.find_field(name).field_id


def test_records_of_a_schema_registered_elsewhere_make_the_batch_evolve_for_them(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """Records written with a schema the topic's subject never had (another subject: the record-name
    strategy of one producer): the batch, produced for the subject's latest, is produced again
    for the evolved schema, and commits once."""
    env = avro_env(make_env, registry)
    Avro(env, registry).produce(300)
    Avro(env, registry, subject=f"{env.topic}-shop.Order").produce(200, v2(), version=2)

    result = env.cli("-v", "run", "--until-caught-up")

    assert result.returncode == 0, result.stderr
    assert "must evolve to take" in result.stderr
    rows = _table(env).scan(selected_fields=("order_id", "coupon")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(500))
    assert [r["coupon"] for r in rows] == [None] * 300 + [f"c{i}" for i in range(300, 500)]
    env.verify()


def test_a_replay_that_meets_a_new_writer_schema_writes_its_fields_on_the_branch(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """A replay's own batch meets records of a writer schema the table lacks: it evolves the table
    on its branch, and its files carry the new fields, which the publish makes main."""
    env = avro_env(make_env, registry)
    Avro(env, registry).produce(300)
    assert env.cli("run", "--until-caught-up").returncode == 0
    head = _table(env).current_snapshot()
    assert head is not None
    Avro(env, registry, subject=f"{env.topic}-shop.Order").produce(200, v2(), version=2)

    replayed = env.cli("replay", "--from-snapshot", str(head.snapshot_id), "--publish", "--json")

    assert replayed.returncode == 0, replayed.stderr
    rows = _table(env).scan(selected_fields=("order_id", "coupon")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(500))
    assert [r["coupon"] for r in rows] == [None] * 300 + [f"c{i}" for i in range(300, 500)]
    env.verify()


#: records of the subject's own schema between two records of new writer schemas: more than a read
#: chunk holds (25k records, and up to as many more from one fetch), so each chunk meets one of them
GAP = 50_000


def test_more_new_writer_schemas_in_a_batch_than_it_catches_up_with_commit_over_two_batches(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """Seven writer schemas the subject's latest does not have (each registered under a subject of
    its own), each met in a read chunk of its own: the batch catches up with five, ends before the
    first record of the sixth and commits; the next batch catches up with the others."""
    env = avro_env(make_env, registry, batch={"max_records": 1_000_000, "read_timeout_s": 30})
    writer = Avro(env, registry)
    plain = writer.serializer(V1)(order(0), writer.context)
    records: list[tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]] = []
    news = []
    for k in range(1, 8):
        schema = json.loads(json.dumps(V1))
        schema["fields"].append({"name": f"extra_{k}", "type": ["null", "string"], "default": None})
        other = Avro(env, registry, subject=f"{env.topic}-extra{k}")
        records += [(0, b"k", plain, [])] * GAP
        news.append(len(records))
        value = other.serializer(schema)(dict(order(k), **{f"extra_{k}": f"x{k}"}), other.context)
        records.append((0, b"k", value, []))
    records += [(1, b"k", plain, [])] * 1_000
    produce(env.bootstrap, env.topic, records)

    result = env.cli("run", "--until-caught-up", "--json")

    assert result.returncode == 0, result.stderr
    batches = [json.loads(line) for line in result.stdout.splitlines()]
    assert [b["status"] for b in batches] == ["committed", "committed"], batches
    first = {r["partition"]: (r["start"], r["end"]) for r in batches[0]["ranges"]}
    assert first == {0: (0, news[5]), 1: (0, 1_000)}, first  # up to the sixth new schema's first record
    table = _table(env)
    snapshots = [s for s in table.metadata.snapshots if _operation(s) == "append"]
    columns = [[f.name for f in _schema_of(table, s).fields if f.name.startswith("extra_")] for s in snapshots]
    assert columns == [[f"extra_{k}" for k in range(1, 6)], [f"extra_{k}" for k in range(1, 8)]], columns
    extras = table.scan(
        row_filter="_kafka_partition = 0", selected_fields=("_kafka_offset", *(f"extra_{k}" for k in range(1, 8)))
    ).to_arrow()
    assert extras.num_rows == len(records) - 1_000
    for k, offset in enumerate(news, start=1):
        row = extras.filter(pc.equal(extras["_kafka_offset"], offset)).to_pylist()
        assert row == [{"_kafka_offset": offset, **{f"extra_{j}": f"x{k}" if j == k else None for j in range(1, 8)}}]
    env.verify()


def test_poison_records_of_each_kind_become_dead_letters_naming_the_cause(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    env = avro_env(make_env, registry)
    writer = Avro(env, registry)
    writer.produce(50)
    good = writer.serializer(V1)(order(999), writer.context)
    assert good is not None
    schema_id = int.from_bytes(good[1:5], "big")
    unknown = b"\x00" + (schema_id + 10_000).to_bytes(4, "big") + good[5:]
    writer.raw([None, b'{"order_id": 1}', b"\x00\x00", good[:-3], unknown, good + b"\x00\x00\x00\x00", good])

    result = env.cli("run", "--until-caught-up", "--json")

    assert result.returncode == 0, result.stderr
    dead = [r["error"] for r in _dead_letters(env)]
    assert len(dead) == 5, dead
    assert "tombstone" in dead[0]
    assert "wrong magic byte 0x7b (it looks like JSON)" in dead[1]
    assert "value is 2 bytes" in dead[2]
    assert f"does not decode as Avro with schema id {schema_id}" in dead[3]
    assert f"unknown schema id {schema_id + 10_000}" in dead[4]
    offsets = _table(env).scan(selected_fields=("_kafka_offset",)).to_arrow().num_rows
    assert offsets == 50 + 2  # the value with trailing bytes decodes, as confluent-kafka's deserializer reads it
    env.verify()


def test_a_schema_registry_that_is_down_is_retryable_and_loses_nothing(make_env: MakeEnv, registry: Apicurio) -> None:
    env = avro_env(make_env, registry)
    Avro(env, registry).produce(100)
    assert env.cli("run").returncode == 0
    Avro(env, registry).produce(100)
    _set(env, schema_registry={"url": "http://127.0.0.1:9/apis/ccompat/v7", "max.retries": 0})

    down = env.cli("run", "--json")

    assert down.returncode == 75, down.stderr
    assert "cannot reach the Schema Registry at http://127.0.0.1:9" in down.stderr
    assert _table(env).scan().to_arrow().num_rows == 100 and not _dead_letters(env)
    _set(env, schema_registry={"url": registry.url})
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert _table(env).scan().to_arrow().num_rows == 200
    env.verify()


def test_on_schema_change_fail_stops_and_dead_letter_sets_the_records_aside(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    env = avro_env(make_env, registry)
    writer = Avro(env, registry)
    writer.produce(100)
    assert env.cli("run").returncode == 0
    writer.produce(40, v2(), version=2)
    snapshots = len(_table(env).metadata.snapshots)
    _set(env, on_schema_change="fail")

    failed = env.cli("run", "--json")

    assert failed.returncode == 65, failed.stderr
    assert "adds" in failed.stderr and "coupon" in failed.stderr and "on_schema_change" in failed.stderr
    assert len(_table(env).metadata.snapshots) == snapshots

    _set(env, on_schema_change="dead_letter")
    assert env.cli("run", "--until-caught-up").returncode == 0
    table = _table(env)
    assert "coupon" not in {f.name for f in table.schema().fields}
    dead = _dead_letters(env)
    assert len(dead) == 40 and all("on_schema_change: dead_letter" in r["error"] for r in dead)
    assert table.scan().to_arrow().num_rows == 100
    env.verify()


def test_a_type_change_iceberg_cannot_follow_stops_the_run(make_env: MakeEnv, registry: Apicurio) -> None:
    env = avro_env(make_env, registry)
    writer = Avro(env, registry)
    writer.produce(20)
    assert env.cli("run").returncode == 0
    changed = json.loads(json.dumps(V1))
    changed["fields"][10]["type"] = "string"  # qty: int -> string (the subject's compatibility is NONE)
    serializer = writer.serializer(changed)
    value = order(20)
    value["qty"] = "twenty"
    writer.raw([serializer(value, writer.context)])

    result = env.cli("run", "--json")

    assert result.returncode == 65, result.stderr
    assert "qty: the table has int, the records string" in result.stderr
    assert _table(env).scan().to_arrow().num_rows == 20


@pytest.mark.crash
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_step_of_a_batch_evolving_for_a_writer_schema_leaves_schema_and_data_together(
    make_env: MakeEnv, registry: Apicurio, point: str
) -> None:
    env = avro_env(make_env, registry)
    writer = Avro(env, registry)
    writer.produce(100)
    assert env.cli("run").returncode == 0
    old = _table(env).schema()
    writer.produce(100, v2(), version=2)

    killed = env.cli("run", env={"INGEST_FAILPOINT": point})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    table = _table(env)
    committed = point in ("between-commits", "after-commit")  # the rows commit decides; dead letters follow
    assert len(table.metadata.snapshots) == 1 + committed
    assert (table.schema() == old) is not committed  # the new columns came with the batch, or not at all
    assert env.cli("run", "--until-caught-up").returncode == 0
    rows = _table(env).scan(selected_fields=("order_id", "coupon")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["coupon"] for r in rows] == [None] * 100 + [f"c{i}" for i in range(100, 200)]
    env.verify()


JSON_ORDER: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "amount": {"type": "number"},
        "created_at": {"type": "string", "format": "date-time"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "street": {"type": ["null", "string"]}},
        },
        "items": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order_id", "amount", "created_at"],
}


def test_a_json_schema_topic_lands_and_a_new_property_evolves_the_table_with_its_batch(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    env = avro_env(make_env, registry)
    _set(env, topics=[{"name": env.topic, "format": "json_schema"}])
    client = SchemaRegistryClient({"url": registry.url, "timeout": REQUEST_TIMEOUT_S})
    client.set_config(
        subject_name=f"{env.topic}-value", config=ServerConfig(compatibility=ConfigCompatibilityLevel.NONE)
    )
    context = SerializationContext(env.topic, MessageField.VALUE)

    def send(schema: dict[str, Any], start: int, count: int, **extra: Any) -> None:
        serializer = JSONSerializer(json.dumps(schema), client, conf={"auto.register.schemas": True})
        records: list[KafkaRecord] = []
        for i in range(start, start + count):
            value = {
                "order_id": i,
                "amount": i / 4,
                "created_at": f"2026-12-{1 + i % 28:02d}T10:00:00Z",
                "address": {"city": f"city-{i % 5}", "street": None},
                "items": [f"sku-{i % 3}"],
                **{k: v(i) for k, v in extra.items()},
            }
            records.append((i % env.partitions, f"k{i}".encode(), serializer(value, context), []))
        produce(env.bootstrap, env.topic, records)

    send(JSON_ORDER, 0, 300)
    assert env.cli("run", "--until-caught-up").returncode == 0
    table = _table(env)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["order_id"] == "long" and types["amount"] == "double" and types["created_at"] == "timestamptz"
    assert table.schema().find_field("order_id").required and not table.schema().find_field("items").required
    snapshots = len(table.metadata.snapshots)

    wider = json.loads(json.dumps(JSON_ORDER))
    wider["properties"]["channel"] = {"type": "string"}
    send(wider, 300, 200, channel=lambda i: ["web", "app"][i % 2])
    result = env.cli("run", "--until-caught-up")

    assert result.returncode == 0, result.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert table.metadata.snapshots[-1].schema_id == table.metadata.current_schema_id
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(500))
    assert rows[7]["address"] == {"city": "city-2", "street": None} and rows[7]["items"] == ["sku-1"]
    assert [r["channel"] for r in rows] == [None] * 300 + [["web", "app"][i % 2] for i in range(300, 500)]
    env.verify()


def test_a_protobuf_topic_lands_and_a_new_field_evolves_the_table_with_its_batch(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    from tests.unit.test_protobuf import classes, order_file

    env = avro_env(make_env, registry, partition_by=[])
    _set(env, topics=[{"name": env.topic, "format": "protobuf"}])
    client = SchemaRegistryClient({"url": registry.url, "timeout": REQUEST_TIMEOUT_S})
    client.set_config(
        subject_name=f"{env.topic}-value", config=ServerConfig(compatibility=ConfigCompatibilityLevel.NONE)
    )
    context = SerializationContext(env.topic, MessageField.VALUE)

    def send(start: int, count: int, extra: bool) -> None:
        order = classes(order_file(extra=extra))
        serializer = ProtobufSerializer(order, client, {"use.deprecated.format": False})
        records: list[KafkaRecord] = []
        for i in range(start, start + count):
            message = order(order_id=i, status=i % 2, big=2**63 + i)
            message.lines.add(sku=f"sku-{i % 3}", qty=i % 5)
            message.created_at.FromDatetime(dt.datetime(2026, 12, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i))
            if extra:
                message.coupon = f"c{i}"
            records.append((i % env.partitions, f"k{i}".encode(), serializer(message, context), []))
        produce(env.bootstrap, env.topic, records)

    send(0, 300, extra=False)
    first = env.cli("run", "--until-caught-up")
    assert first.returncode == 0, first.stderr
    table = _table(env)
    assert str(table.schema().find_field("big").field_type) == "decimal(20, 0)"
    snapshots = len(table.metadata.snapshots)

    send(300, 200, extra=True)
    second = env.cli("run", "--until-caught-up")

    assert second.returncode == 0, second.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert table.metadata.snapshots[-1].schema_id == table.metadata.current_schema_id
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(500))
    assert rows[7]["status"] == "PAID" and rows[7]["lines"] == [{"sku": "sku-1", "qty": 2}]
    assert rows[7]["big"] == Decimal(2**63 + 7)
    assert rows[7]["created_at"] == dt.datetime(2026, 12, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=7)
    assert [r["coupon"] for r in rows] == [None] * 300 + [f"c{i}" for i in range(300, 500)]
    env.verify()


def test_protobuf_imports_and_avro_named_types_resolve_through_the_registrys_references(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """Schemas that refer to schemas of other subjects: a Protobuf file importing another (registered
    as references by confluent-kafka's ``ProtobufSerializer``), and an Avro record naming a type of
    another subject (registered with a reference by hand, as Confluent documents)."""
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message_factory import GetMessageClass

    from tests.unit.test_protobuf import referenced_files

    client = SchemaRegistryClient({"url": registry.url, "timeout": REQUEST_TIMEOUT_S})
    proto_env = avro_env(make_env, registry, partition_by=[])
    _set(proto_env, topics=[{"name": proto_env.topic, "format": "protobuf"}])
    pool = DescriptorPool()
    for file in referenced_files():
        pool.Add(file)
    payment = GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))
    serializer = ProtobufSerializer(payment, client, {"use.deprecated.format": False})
    context = SerializationContext(proto_env.topic, MessageField.VALUE)
    messages: list[KafkaRecord] = []
    for i in range(40):
        message = payment(payment_id=i)
        message.total.currency, message.total.units = i % 2, 100 + i
        messages.append((i % 2, f"k{i}".encode(), serializer(message, context), []))
    produce(proto_env.bootstrap, proto_env.topic, messages)

    done = proto_env.cli("run", "--until-caught-up")

    assert done.returncode == 0, done.stderr
    registered = client.get_latest_version(f"{proto_env.topic}-value").schema.references
    assert registered is not None
    assert [r.name for r in registered] == ["shop/money.proto"]  # the serializer's, resolved by ingest
    rows = _table(proto_env).scan().to_arrow().sort_by("payment_id").to_pylist()
    assert [r["total"] for r in rows[:2]] == [{"currency": "EUR", "units": 100}, {"currency": "USD", "units": 101}]
    proto_env.verify()

    avro_env_ = avro_env(make_env, registry, partition_by=[])
    currency = {"type": "enum", "name": "Currency", "namespace": "shop", "symbols": ["EUR", "USD"]}
    money = {"type": "record", "name": "Money", "namespace": "shop",
             "fields": [{"name": "currency", "type": "shop.Currency"}, {"name": "units", "type": "long"}]}  # fmt: skip
    record = {"type": "record", "name": "Payment", "namespace": "shop",
              "fields": [{"name": "payment_id", "type": "long"}, {"name": "total", "type": "shop.Money"}]}  # fmt: skip
    prefix = avro_env_.topic
    client.register_schema(f"{prefix}-currency", Schema(json.dumps(currency), "AVRO"))
    ref = SchemaReference("shop.Currency", f"{prefix}-currency", 1)
    client.register_schema(f"{prefix}-money", Schema(json.dumps(money), "AVRO", [ref]))
    schema = Schema(json.dumps(record), "AVRO", [SchemaReference("shop.Money", f"{prefix}-money", 1)])
    avro_serializer = AvroSerializer(client, schema, conf={"auto.register.schemas": True})
    context = SerializationContext(avro_env_.topic, MessageField.VALUE)
    values: list[KafkaRecord] = [
        (
            i % 2,
            f"k{i}".encode(),
            avro_serializer({"payment_id": i, "total": {"currency": "USD", "units": i}}, context),
            [],
        )
        for i in range(30)
    ]
    produce(avro_env_.bootstrap, avro_env_.topic, values)

    done = avro_env_.cli("run", "--until-caught-up")

    assert done.returncode == 0, done.stderr
    table = _table(avro_env_)
    total = table.schema().find_field("total").field_type
    assert isinstance(total, StructType) and [f.name for f in total.fields] == ["currency", "units"]
    rows = table.scan().to_arrow().sort_by("payment_id").to_pylist()
    assert [r["total"] for r in rows[:2]] == [{"currency": "USD", "units": 0}, {"currency": "USD", "units": 1}]
    assert len(rows) == 30
    avro_env_.verify()


KEY_V1 = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [{"name": "tenant", "type": "string"}]}
KEY_V2 = {**KEY_V1, "fields": [*KEY_V1["fields"], {"name": "region", "type": ["null", "string"], "default": None}]}


def test_avro_keys_land_in_the_key_column_and_a_new_key_schema_evolves_it_with_its_batch(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """``key_format: avro``: keys written by confluent-kafka's AvroSerializer (subject
    ``<topic>-key``) land as a struct beside the raw key; a key schema that adds a field mid-stream
    evolves the column in the batch's own snapshot, old rows reading null in it."""
    env = avro_env(make_env, registry, partition_by=[])
    _set(env, topics=[{"name": env.topic, "format": "avro", "key_format": "avro"}])
    writer = Avro(env, registry)
    writer.client.set_config(
        subject_name=f"{env.topic}-key", config=ServerConfig(compatibility=ConfigCompatibilityLevel.NONE)
    )
    values = writer.serializer(V1)
    keys_context = SerializationContext(env.topic, MessageField.KEY)

    def send(start: int, count: int, key_schema: dict[str, Any]) -> None:
        keys = AvroSerializer(writer.client, json.dumps(key_schema), conf={"auto.register.schemas": True})
        records: list[KafkaRecord] = []
        for i in range(start, start + count):
            key: dict[str, Any] = {"tenant": f"t{i % 3}"}
            if key_schema is KEY_V2:
                key["region"] = f"r{i % 2}"
            records.append((i % env.partitions, keys(key, keys_context), values(order(i), writer.context), []))
        produce(env.bootstrap, env.topic, records)

    send(0, 120, KEY_V1)
    first = env.cli("run", "--until-caught-up")
    assert first.returncode == 0, first.stderr
    snapshots = len(_table(env).metadata.snapshots)

    send(120, 60, KEY_V2)
    second = env.cli("run", "--until-caught-up")

    assert second.returncode == 0, second.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert table.metadata.snapshots[-1].schema_id == table.metadata.current_schema_id
    key_type = table.schema().find_field("_kafka_key_decoded").field_type
    assert table.schema().find_field("order_id").required  # the key's evolution leaves the values' columns be
    assert isinstance(key_type, StructType) and [f.name for f in key_type.fields] == ["tenant", "region"]
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(180))
    assert rows[4]["_kafka_key_decoded"] == {"tenant": "t1", "region": None}
    assert rows[4]["_kafka_key"][:1] == b"\x00"  # the raw key stays as Kafka had it
    assert rows[125]["_kafka_key_decoded"] == {"tenant": "t2", "region": "r1"}
    env.verify()


def test_string_keys_of_json_values_land_decoded_and_a_key_that_is_not_utf8_is_a_dead_letter(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, partition_by=["bucket(4, _kafka_key_decoded)"])
    _set(env, topics=[{"name": env.topic, "key_format": "string"}])
    env.produce(50)
    value = json.dumps({"order_id": 50, "amount": "1.25", "created_at": "2026-11-01T10:00:00Z"}).encode()
    produce(env.bootstrap, env.topic, [(0, b"\xff\xfe", value, []), (1, None, value.replace(b"50", b"51"), [])])

    done = env.cli("run", "--until-caught-up")

    assert done.returncode == 0, done.stderr
    table = _table(env)
    assert str(table.spec().fields[0].transform) == "bucket[4]"
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["_kafka_key_decoded"] for r in rows] == [f"k{i}" for i in range(50)] + [None]
    (dead,) = _dead_letters(env)
    assert dead["error"].startswith("key: not UTF-8 text")
    env.verify()


def test_a_field_the_writers_renamed_lands_in_the_same_column_when_the_config_says_so(
    make_env: MakeEnv, registry: Apicurio
) -> None:
    """v2 of the writer schema renames ``qty`` to ``quantity``; with ``renames: {qty: quantity}`` the
    table's column keeps its field id under the new name (renamed in the batch's snapshot), and
    records of v1 and v2 both land in it."""
    env = avro_env(make_env, registry, partition_by=[])
    writer = Avro(env, registry)
    writer.produce(60)
    assert env.cli("run", "--until-caught-up").returncode == 0
    before = _table(env)
    qty = before.schema().find_field("qty")
    renamed = json.loads(json.dumps(V1))
    renamed["fields"][10]["name"] = "quantity"
    _set(env, renames={"qty": "quantity"})
    new, old = writer.serializer(renamed), writer.serializer(V1)
    records: list[KafkaRecord] = []
    for i in range(60, 100):
        value = order(i)
        if i < 80:
            value["quantity"] = value.pop("qty")
        records.append((i % env.partitions, f"k{i}".encode(), (new if i < 80 else old)(value, writer.context), []))
    produce(env.bootstrap, env.topic, records)

    done = env.cli("run", "--until-caught-up")

    assert done.returncode == 0, done.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == len(before.metadata.snapshots) + 1
    quantity = table.schema().find_field("quantity")
    assert quantity.field_id == qty.field_id and "qty" not in table.schema().column_names
    rows = table.scan(selected_fields=("order_id", "quantity")).to_arrow().sort_by("order_id").to_pylist()
    assert rows == [{"order_id": i, "quantity": i % 100} for i in range(100)]
    env.verify()


def test_plain_avro_with_a_schema_file_lands_without_a_registry_and_follows_the_file(make_env: MakeEnv) -> None:
    """A topic of plain Avro bodies (no wire-format prefix, no registry: what fastavro's
    ``schemaless_writer`` writes), its writer schema in an ``.avsc`` file beside the config."""
    import io

    import fastavro

    env = make_env(partitions=2, schema=None, partition_by=["day(created_at)"])
    schema_file = env.config_path.with_name("order.avsc")
    schema_file.write_text(json.dumps(V1))
    _set(env, topics=[{"name": env.topic, "format": "avro", "schema_file": "order.avsc"}])

    def send(schema: dict[str, Any], start: int, count: int, version: int) -> None:
        parsed = fastavro.parse_schema(json.loads(json.dumps(schema)))
        records: list[KafkaRecord] = []
        for i in range(start, start + count):
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parsed, order(i, version))
            records.append((i % env.partitions, f"k{i}".encode(), body.getvalue(), []))
        produce(env.bootstrap, env.topic, records)

    send(V1, 0, 400, 1)
    first = env.cli("run", "--until-caught-up")
    assert first.returncode == 0, first.stderr
    schema_file.write_text(json.dumps(v2()))  # the producer team ships v2 and the file with it
    send(v2(), 400, 100, 2)
    second = env.cli("run", "--until-caught-up")

    assert second.returncode == 0, second.stderr
    table = _table(env)
    assert str(table.schema().find_field("qty").field_type) == "long"
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(500))
    assert rows[5]["address"] == order(5)["address"] | {"zip": None} and rows[5]["status"] == order(5)["status"]
    assert [r["coupon"] for r in rows] == [None] * 400 + [f"c{i}" for i in range(400, 500)]
    env.verify()
