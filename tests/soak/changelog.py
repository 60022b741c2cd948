"""The soak's changelog pipeline ``customers``: Debezium changes of a customers table, and the
check that its Iceberg table is the fold of every change produced.

The producer sends, beside the orders, Debezium events over :data:`KEYS` customers (creates,
updates, deletes each followed by its tombstone, one event in 97 poison), a key's events always in
partition ``key mod partitions``. The check folds the delivered events in offset order: every live
key has exactly one row, its newest change's image at that change's coordinates; a deleted key has
none; each poison event is a dead letter exactly once; and ``ingest verify`` is ok.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from ingest.config import load
from ingest.iceberg.catalog import connect
from ingest.iceberg.layout import existing

PIPELINE = "customers"
PARTITIONS = 2
KEYS = 400
SCHEMA: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "email", "type": "string"},
    {"name": "visits", "type": "long"},
]
CHANGES = {"envelope": "debezium", "key": ["id"]}
#: not a change: not JSON, an unknown op, an image without its key
POISON = [
    b"{not json",
    b'{"before": null, "after": null, "op": "x"}',
    b'{"before": null, "after": {"email": "a"}, "op": "c"}',
]
Coordinates = tuple[str, int, int]


@dataclass(frozen=True)
class Change:
    """What one delivered record was: ``upsert`` (``row`` its after image), ``delete``,
    ``tombstone`` or ``poison``."""

    key: int
    kind: str
    row: dict[str, Any] | None = None


@dataclass
class Changes:
    """The customers' changes the producer sends, and what the delivery reports say landed where."""

    topic: str
    seed: int
    delivered: dict[Coordinates, Change] = field(default_factory=dict)
    _rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    _sent: int = 0

    def send(self, producer: Producer, count: int) -> None:
        """``count`` more events (a delete's tombstone beside it)."""
        rng = random.Random(self.seed * 1_000_003 + self._sent)
        for _ in range(count):
            self._sent += 1
            key = rng.randrange(KEYS)
            before = self._rows.get(key)
            if self._sent % 97 == 0:
                self._produce(producer, key, POISON[self._sent % len(POISON)], Change(key, "poison"))
            elif before is not None and rng.random() < 0.15:
                event = {"before": before, "after": None, "op": "d", "source": {}}
                self._produce(producer, key, json.dumps(event).encode(), Change(key, "delete"))
                self._produce(producer, key, None, Change(key, "tombstone"))
                del self._rows[key]
            else:
                after = {"id": key, "email": f"{key}-{self._sent}@acme.com", "visits": self._sent}
                event = {"before": before, "after": after, "op": "u" if before else "c", "source": {}}
                self._produce(producer, key, json.dumps(event).encode(), Change(key, "upsert", after))
                self._rows[key] = after

    def _produce(self, producer: Producer, key: int, value: bytes | None, change: Change) -> None:
        def delivered(error: Any, message: Any) -> None:
            if error is None:
                self.delivered[(message.topic(), message.partition(), message.offset())] = change

        producer.produce(
            self.topic, value=value, key=str(key).encode(), partition=key % PARTITIONS, on_delivery=delivered
        )

    def fold(self) -> dict[int, tuple[Coordinates, dict[str, Any]]]:
        """Each live key's newest row and the coordinates of the change that wrote it."""
        rows: dict[int, tuple[Coordinates, dict[str, Any]]] = {}
        for coordinates, change in sorted(self.delivered.items()):
            if change.kind == "upsert":
                assert change.row is not None
                rows[change.key] = (coordinates, change.row)
            elif change.kind == "delete":
                rows.pop(change.key, None)
        return rows


def problems(config_path: Any, changes: Changes) -> tuple[list[str], dict[str, int]]:
    """What is wrong with the table and dead letters of the pipeline of ``config_path`` against
    the fold of ``changes``; and the figures checked."""
    config = load(config_path)
    catalog = connect(config.catalog)
    rows_table = existing(catalog, config.table)
    dead_table = existing(catalog, config.dead_letters)
    assert rows_table is not None and dead_table is not None
    rows = rows_table.scan_columns(["_kafka_topic", "_kafka_partition", "_kafka_offset", *(c["name"] for c in SCHEMA)])
    dead = dead_table.scan_columns(["topic", "partition", "offset"]).to_pylist()
    expected = changes.fold()
    found: list[str] = []
    by_key = Counter(rows["id"].to_pylist())
    found += [f"key {key}: {n} rows" for key, n in sorted(by_key.items()) if n > 1]
    for row in rows.to_pylist():
        coordinates = (row["_kafka_topic"], row["_kafka_partition"], row["_kafka_offset"])
        want = expected.get(row["id"])
        image = {c["name"]: row[c["name"]] for c in SCHEMA}
        if want is None:
            found.append(f"key {row['id']}: a row from {coordinates}, but its newest change deleted it (or none)")
        elif (coordinates, image) != want:
            found.append(f"key {row['id']}: {image} from {coordinates}, not {want[1]} from {want[0]}")
    found += [
        f"key {key}: no row, but {want[0]} wrote one" for key, want in sorted(expected.items()) if key not in by_key
    ]
    poison = {c for c, change in changes.delivered.items() if change.kind == "poison"}
    seen = Counter((d["topic"], d["partition"], d["offset"]) for d in dead if d["topic"] == changes.topic)
    found += [f"{c}: poison, {seen.get(c, 0)} dead letters" for c in sorted(poison) if seen.get(c, 0) != 1]
    found += [f"{c}: a dead letter, but no poison was produced there" for c in sorted(set(seen) - poison)]
    figures = {"changes": len(changes.delivered), "live keys": len(expected), "poison": len(poison)}
    return found, figures
