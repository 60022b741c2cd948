"""What users ask of a pipeline: its status (lag), its history (batches) and a verification.

Each function returns plain data (JSON-ready dicts); the CLI renders it for people or machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.ledger import TopicPartition, decode, decode_counts
from ingest.pipeline import Pipeline

#: how many offsets of each kind a verification report lists per partition
SAMPLE = 20


def status(pipeline: Pipeline) -> dict[str, Any]:
    found = pipeline.ledger()
    view = pipeline.source.describe()
    committed = dict(found.ledger.offsets) if found else {}
    partitions = []
    for tp, wm in sorted(view.partitions.items()):
        offset = committed.get(tp)
        partitions.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "committed": offset,
                "low": wm.low,
                "end": wm.high,
                "lag": wm.high - (offset if offset is not None else wm.low),
            }
        )
    return {
        "pipeline": pipeline.config.pipeline,
        "table": pipeline.config.table,
        "batch": found.ledger.batch if found else None,
        "snapshot_id": found.snapshot_id if found else None,
        "valid_through_ms": found.ledger.valid_through if found else None,
        "lag": sum(p["lag"] for p in partitions),
        "partitions": partitions,
    }


def history(pipeline: Pipeline, limit: int | None = None) -> list[dict[str, Any]]:
    """This pipeline's snapshots on the main branch, newest first."""
    name = pipeline.config.pipeline
    pipeline.rows.refresh()
    rows = []
    for snap in pipeline.rows.ancestry():
        ledger = decode(name, snap.summary)
        if ledger is None:
            continue
        counts = decode_counts(name, snap.summary)
        ranges = [
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "start": ledger.start_offsets.get(tp, end),
                "end": end,
            }
            for tp, end in sorted(ledger.offsets.items())
            if ledger.start_offsets.get(tp, end) != end
        ]
        rows.append(
            {
                "snapshot_id": snap.snapshot_id,
                "timestamp_ms": snap.timestamp_ms,
                "batch": ledger.batch,
                "records": counts.records,
                "dead_letters": counts.dead_letters,
                "bytes": counts.bytes,
                "valid_through_ms": ledger.valid_through,
                "ranges": ranges,
                "lost": [
                    {"topic": r.tp.topic, "partition": r.tp.partition, "start": r.start, "end": r.end}
                    for r in ledger.lost
                ],
            }
        )
        if limit is not None and len(rows) >= limit:
            break
    return rows


@dataclass
class PartitionCheck:
    tp: TopicPartition
    start: int
    end: int
    in_kafka: int = 0
    rows: int = 0
    dead_letters: int = 0
    missing: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "start": self.start,
            "end": self.end,
            "in_kafka": self.in_kafka,
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "ok": self.ok,
        }


def _offsets_by_partition(table: pa.Table, topic: str, partition: str, offset: str) -> dict[TopicPartition, pa.Array]:
    result: dict[TopicPartition, pa.Array] = {}
    if table.num_rows == 0:
        return result
    keys = table.group_by([topic, partition]).aggregate([]).to_pylist()
    for key in keys:
        mask = pc.and_(pc.equal(table[topic], key[topic]), pc.equal(table[partition], key[partition]))
        result[TopicPartition(key[topic], key[partition])] = table.filter(mask)[offset].combine_chunks()
    return result


def _sample(array: pa.Array) -> list[int]:
    return sorted(array.to_pylist())[:SAMPLE]


def verify(pipeline: Pipeline) -> dict[str, Any]:
    """Every offset of the ledger's ranges that Kafka still holds is in the table or the dead
    letters exactly once, and no row lies outside them."""
    name = pipeline.config.pipeline
    found = pipeline.ledger()
    if found is None:
        return {"pipeline": name, "ok": True, "partitions": [], "note": "nothing committed yet"}
    origin: dict[TopicPartition, int] = {}
    lost: list[tuple[TopicPartition, int, int]] = []
    for snap in pipeline.rows.ancestry():
        ledger = decode(name, snap.summary)
        if ledger is None:
            continue
        for tp, start in ledger.start_offsets.items():
            origin[tp] = min(origin.get(tp, start), start)
        lost.extend((r.tp, r.start, r.end) for r in ledger.lost)
    view = pipeline.source.describe()
    ranges = []
    for tp, end in sorted(found.ledger.offsets.items()):
        start = origin.get(tp, end)
        low = view.partitions[tp].low if tp in view.partitions else end
        ranges.append((tp, max(start, low), end))
    in_kafka: dict[TopicPartition, list[pa.Array]] = {}
    for chunk in pipeline.source.read(ranges, chunk_records=500_000):
        parts = _offsets_by_partition(
            pa.table({"t": chunk.topic, "p": chunk.partition, "o": chunk.offset}), "t", "p", "o"
        )
        for tp, offsets in parts.items():
            in_kafka.setdefault(tp, []).append(offsets)
    rows = pipeline.rows.scan_columns(["_kafka_topic", "_kafka_partition", "_kafka_offset"], found.snapshot_id)
    rows = rows.filter(pc.is_in(rows["_kafka_topic"], pa.array(pipeline.config.topics)))
    pipeline.dead.refresh()
    dead = pipeline.dead.scan_columns(["topic", "partition", "offset"])
    row_offsets = _offsets_by_partition(rows, "_kafka_topic", "_kafka_partition", "_kafka_offset")
    dead_offsets = _offsets_by_partition(dead, "topic", "partition", "offset")
    checks = []
    empty = pa.array([], pa.int64())
    for tp, start, end in ranges:
        check = PartitionCheck(tp, start, end)
        kafka = pa.concat_arrays(in_kafka.get(tp, [empty]))
        mine_rows = row_offsets.get(tp, empty)
        mine_dead = dead_offsets.get(tp, empty)
        # dead letters at or past the rows ledger are normal after a crash between the two commits
        mine_dead = mine_dead.filter(pc.less(mine_dead, end)) if len(mine_dead) else mine_dead
        landed = pa.concat_arrays([mine_rows, mine_dead])
        if len(landed):
            counts = pc.value_counts(landed)
            check.duplicated = _sample(counts.field("values").filter(pc.greater(counts.field("counts"), 1)))
            beyond = landed.filter(pc.greater_equal(landed, end))
            in_range = landed.filter(pc.and_(pc.greater_equal(landed, start), pc.less(landed, end)))
            check.unexpected = _sample(
                pa.concat_arrays([beyond, in_range.filter(pc.invert(pc.is_in(in_range, kafka)))])
            )
        for lost_tp, lost_start, lost_end in lost:  # recorded by `on_data_loss: skip`
            if lost_tp == tp and len(kafka):
                gone = pc.and_(pc.greater_equal(kafka, lost_start), pc.less(kafka, lost_end))
                kafka = kafka.filter(pc.invert(gone))
        check.in_kafka, check.rows, check.dead_letters = len(kafka), len(mine_rows), len(mine_dead)
        if len(kafka):
            check.missing = _sample(kafka.filter(pc.invert(pc.is_in(kafka, landed))) if len(landed) else kafka)
        checks.append(check)
    return {
        "pipeline": name,
        "ok": all(c.ok for c in checks),
        "snapshot_id": found.snapshot_id,
        "batch": found.ledger.batch,
        "lost_ranges": [{"topic": tp.topic, "partition": tp.partition, "start": s, "end": e} for tp, s, e in lost],
        "partitions": [c.as_dict() for c in checks],
    }
