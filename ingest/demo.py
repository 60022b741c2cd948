"""``make demo``: the embedded broker, a realistic order stream, batches, and what a user looks at."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ingest import config as config_module
from ingest import records
from ingest.kafka.admin import create_topic, produce
from ingest.kafka.embedded import EmbeddedBroker
from ingest.ops import report
from ingest.pipeline import Pipeline
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


def _fresh_warehouse(config_path: Path) -> None:
    raw = config_module.load(config_path, env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "unused"})
    warehouse = raw.catalog.get("warehouse", "")
    if warehouse.startswith("file://"):
        path = Path(warehouse.removeprefix("file://"))
        if (path / "catalog.db").exists():  # only ever remove a warehouse the demo made
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)


def main(records: int, config_path: Path, console: Console) -> None:
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


def _show(pipeline: Pipeline, console: Console) -> None:
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
    check = report.verify(pipeline)
    in_kafka = sum(p.in_kafka for p in check.partitions)
    landed = sum(p.rows + p.dead_letters for p in check.partitions)
    verdict = "[bold green]ok[/]" if check.ok else "[bold red]FAILED[/]"
    console.print(f"verify: {verdict} — {in_kafka} records in Kafka = {landed} rows + dead letters")
