"""``ingest demo`` (``make demo``): the embedded broker, a realistic order stream, batches, and what a user looks at."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ingest import config as config_module
from ingest import records
from ingest.assembly import Opened
from ingest.errors import ConfigError
from ingest.kafka.admin import create_topic, produce
from ingest.kafka.embedded import EmbeddedBroker
from ingest.kafka.registry import avro_serializer
from ingest.ops import report, verify
from ingest.runner import opened

PARTITIONS = 4
STATUSES = ("created", "paid", "shipped", "delivered", "cancelled")
CURRENCIES = ("EUR", "USD", "GBP")

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def order_events(count: int, first_id: int, seed: int, malformed_every: int = 2_000) -> Iterator[Record]:
    """Order events of ~120 bytes; one in ``malformed_every`` is broken in one of the usual ways."""
    rng = random.Random(seed)
    start = datetime(2026, 11, 30, tzinfo=UTC)
    broken = (
        lambda oid: b'{"order_id": ' + str(oid).encode() + b', "customer_id": ',  # truncated JSON
        lambda oid: json.dumps({"order_id": oid, "status": "paid"}).encode(),  # required fields missing
        lambda oid: json.dumps({"order_id": str(oid), "customer_id": "c-9", "created_at": "x"}).encode(),  # types
        lambda oid: b"[1, 2, 3]",  # not an object
        lambda oid: None,  # tombstone
    )
    for i in range(count):
        order_id = first_id + i
        partition = order_id % PARTITIONS
        key = f"order-{order_id}".encode()
        headers = [("source", b"checkout"), ("schema", b"orders.v1")]
        if malformed_every and i % malformed_every == malformed_every - 1:
            yield partition, key, broken[(i // malformed_every) % len(broken)](order_id), headers
            continue
        created = start + timedelta(seconds=i * 86_400 * 2 / max(count, 1) + rng.random())
        value = {
            "order_id": order_id,
            "customer_id": rng.randrange(1, 50_000),
            "status": rng.choice(STATUSES),
            "amount": f"{rng.uniform(3, 900):.2f}",
            "currency": rng.choice(CURRENCIES),
            "items": rng.randrange(1, 8),
            "created_at": created.isoformat().replace("+00:00", "Z"),
        }
        yield partition, key, json.dumps(value, separators=(",", ":")).encode(), headers


#: the demo's Avro order events; version 2 (deployed half-way) adds the optional ``coupon``
AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer_id", "type": "long"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": list(STATUSES)}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}],
                },
            },
        },
    ],
}
AVRO_ORDER_V2 = {
    **AVRO_ORDER,
    "fields": [*AVRO_ORDER["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],  # type: ignore[list-item]
}


def avro_orders(count: int, first_id: int, seed: int, version: int) -> Iterator[tuple[int, bytes, dict[str, object]]]:
    """Order events for the Avro topic, as (partition, key, value)."""
    rng = random.Random(seed)
    start = datetime(2026, 11, 30, tzinfo=UTC)
    for i in range(count):
        order_id = first_id + i
        value: dict[str, object] = {
            "order_id": order_id,
            "customer_id": rng.randrange(1, 50_000),
            "status": rng.choice(STATUSES),
            "amount": Decimal(f"{rng.uniform(3, 900):.2f}"),
            "created_at": start + timedelta(seconds=i * 86_400 * 2 / max(count, 1)),
            "lines": [
                {"sku": f"sku-{rng.randrange(100)}", "qty": rng.randrange(1, 4)} for _ in range(rng.randrange(1, 4))
            ],
        }
        if version == 2:
            value["coupon"] = rng.choice([None, "WINTER10", "FREESHIP"])
        yield order_id % PARTITIONS, f"order-{order_id}".encode(), value


def _fresh_warehouse(config_path: Path) -> None:
    raw = config_module.load(config_path, env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "unused"})
    warehouse = raw.catalog.get("warehouse", "")
    if warehouse.startswith("file://"):
        path = Path(warehouse.removeprefix("file://"))
        if (path / "catalog.db").exists():  # only ever remove a warehouse the demo made
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)


def example(name: str) -> Path:
    """An example config packaged with ingest (the repository's ``conf/``)."""
    path = Path(str(files("ingest.examples") / name))
    if not path.is_file():
        raise ConfigError(f"the example config {name} is not in this installation of ingest ({path})")
    return path


def main(records: int, config_path: Path | None, console: Console) -> None:
    if config_path is None:  # the packaged example, its catalog and warehouse in ./warehouse
        config_path = example("orders.yaml")
        warehouse = Path.cwd() / "warehouse"
        os.environ.setdefault("ICEBERG_CATALOG_URI", f"sqlite:///{warehouse}/catalog.db")
        os.environ.setdefault("ICEBERG_WAREHOUSE", warehouse.as_uri())
    _fresh_warehouse(config_path)
    with EmbeddedBroker() as broker:
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
        config = config_module.load(config_path)
        console.rule(f"embedded broker tansu on {broker.bootstrap_servers}")
        create_topic(broker.bootstrap_servers, "orders", PARTITIONS)
        first = records * 3 // 4
        sent = produce(broker.bootstrap_servers, "orders", order_events(first, 1, seed=1))
        console.print(f"produced {sent} order events to 'orders' ({PARTITIONS} partitions)")
        with opened(config) as run:
            for result in run.batches(until_caught_up=True):
                console.print(
                    f"  batch {result.batch}: {result.status}, {result.records} rows, "
                    f"{result.dead_letters} dead letters in {result.seconds:.2f}s"
                )
            sent = produce(broker.bootstrap_servers, "orders", order_events(records - first, first + 1, seed=2))
            console.print(f"produced {sent} more; running again")
            for result in run.batches(until_caught_up=True):
                console.print(
                    f"  batch {result.batch}: {result.status}, {result.records} rows, "
                    f"{result.dead_letters} dead letters in {result.seconds:.2f}s"
                )
            result = run.batch()
            console.print(f"  one more batch with nothing new: {result.status} (no snapshot written)")
            _show(run.pipeline, console)
        registry = os.environ.get("SCHEMA_REGISTRY_URL")
        if registry:
            _avro(broker.bootstrap_servers, registry, records, config_path.with_name("orders_avro.yaml"), console)
        else:
            console.rule("Avro topic: skipped")
            console.print("no Schema Registry (SCHEMA_REGISTRY_URL unset; `make demo` starts Apicurio Registry)")


def _avro(bootstrap: str, registry: str, records: int, config_path: Path, console: Console) -> None:
    """An Avro topic whose producer deploys a new schema version half-way: the table follows."""
    console.rule(f"Avro topic 'orders-avro', schemas in the registry at {registry}")
    create_topic(bootstrap, "orders-avro", PARTITIONS)
    config = config_module.load(config_path)
    half = records // 4
    for version, schema, first in ((1, AVRO_ORDER, 1), (2, AVRO_ORDER_V2, half + 1)):
        serialize = avro_serializer(registry, json.dumps(schema), "orders-avro")
        events = ((p, k, serialize(v)) for p, k, v in avro_orders(half, first, seed=version, version=version))
        sent = produce(bootstrap, "orders-avro", ((p, k, v, None) for p, k, v in events))
        console.print(f"produced {sent} Avro order events with writer schema v{version}")
        with opened(config) as run:
            for result in run.batches(until_caught_up=True):
                console.print(
                    f"  batch {result.batch}: {result.status}, {result.records} rows in {result.seconds:.2f}s"
                )
            pipeline = run.pipeline
    _show_schemas(pipeline, console)


def _show_schemas(pipeline: Opened, console: Console) -> None:
    table = pipeline.rows.table.refresh()
    history = Table("snapshot", "schema id", "columns", title=f"{pipeline.config.table}: schema history")
    schemas = {s.schema_id: s for s in table.metadata.schemas}
    for snapshot in table.metadata.snapshots:
        fields = [f.name for f in schemas[snapshot.schema_id or 0].fields if not f.name.startswith("_kafka")]
        history.add_row(str(snapshot.snapshot_id), str(snapshot.schema_id), ", ".join(fields))
    console.print(history)
    rows = (
        table.scan(selected_fields=("order_id", "status", "amount", "lines", "coupon")).to_arrow().sort_by("order_id")
    )
    console.print("first rows (written before the coupon field existed: null):", rows.slice(0, 2).to_pylist())
    console.print("last rows (written with schema v2):", rows.slice(rows.num_rows - 2).to_pylist())


def _show(pipeline: Opened, console: Console) -> None:
    rows = pipeline.rows.table.scan().to_arrow()
    console.rule(f"{pipeline.config.table}: {rows.num_rows} rows")
    console.print(rows.slice(0, 3).drop_columns([records.ROWS.key]).to_pylist())
    dead = pipeline.dead.table.refresh().scan().to_arrow()
    console.rule(f"{pipeline.config.dead_letters}: {dead.num_rows} dead letters")
    sample = Table("topic[partition]@offset", "error", "value")
    for row in dead.slice(0, 5).to_pylist():
        value = row["value"][:40].decode(errors="replace") if row["value"] is not None else "null"
        sample.add_row(f"{row['topic']}[{row['partition']}]@{row['offset']}", row["error"], value)
    console.print(sample)
    snapshots = Table(
        "batch",
        "snapshot",
        "records",
        "dead letters",
        "ledger after (next offset per partition)",
        title="snapshots and their ledgers",
    )
    for entry in report.history(pipeline):
        ends = " ".join(f"{r.partition}:{r.end}" for r in entry.ranges)
        snapshots.add_row(str(entry.batch), str(entry.snapshot_id), str(entry.records), str(entry.dead_letters), ends)
    console.print(snapshots)
    lag = Table("partition", "committed", "end", "lag", title="lag")
    for p in report.status(pipeline).partitions:
        lag.add_row(f"{p.topic}[{p.partition}]", str(p.committed), str(p.end), str(p.lag))
    console.print(lag)
    check = verify.verify(pipeline)
    in_kafka = sum(p.in_kafka for p in check.partitions)
    landed = sum(p.rows + p.dead_letters for p in check.partitions)
    verdict = "[bold green]ok[/]" if check.ok else "[bold red]FAILED[/]"
    console.print(f"verify: {verdict} — {in_kafka} records in Kafka = {landed} rows + dead letters")
