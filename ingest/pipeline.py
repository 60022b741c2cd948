"""One pipeline: plan a batch, turn its ranges into data files, commit both tables exactly once.

Engines differ only in :meth:`Engine.produce` (how planned ranges become Parquet files); planning
and committing are here, shared.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import pyarrow as pa

from ingest import failpoints
from ingest.committer import commit_dead_letters, commit_rows, observe
from ingest.config import PipelineConfig
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Found, Ledger, TopicPartition
from ingest.core.plan import Batch, KafkaView, PlanPolicy, plan_batch
from ingest.decode import DEAD_LETTER_SCHEMA, Decoder, RawChunk
from ingest.errors import Fenced
from ingest.iceberg import DataFile, IcebergTable, connect, dead_letter_schema, partition_spec, rows_schema
from ingest.kafka import KafkaSource

log = logging.getLogger(__name__)

#: planning uses the rows table's metadata as held if it was loaded this recently
PLAN_FROM_HELD_S = 1.0


@dataclass
class Produced:
    """What an engine made of a batch's ranges: committed nowhere yet."""

    files: list[DataFile]
    dead_letters: pa.Table
    records: int
    nbytes: int
    #: newest record timestamp read per partition (ms)
    timestamps: dict[TopicPartition, int]


class Engine(Protocol):
    def produce(self, batch: Batch) -> Produced: ...


@dataclass(frozen=True)
class BatchResult:
    pipeline: str
    batch: int
    status: str  # committed | landed | empty
    snapshot_id: int | None
    records: int = 0
    dead_letters: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "pipeline": self.pipeline,
            "batch": self.batch,
            "status": self.status,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "dead_letters": self.dead_letters,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "ranges": [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in self.ranges],
        }


def _max_timestamps(table: pa.Table, topic: str, partition: str, ts: str) -> dict[TopicPartition, int]:
    if table.num_rows == 0:
        return {}
    grouped = table.group_by([topic, partition]).aggregate([(ts, "max")])
    result = {}
    for row in grouped.to_pylist():
        value = row[f"{ts}_max"]
        if value is not None:
            result[TopicPartition(row[topic], row[partition])] = int(value.timestamp() * 1000)
    return result


def _merge_max(a: Mapping[TopicPartition, int], b: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    merged = dict(a)
    for tp, value in b.items():
        merged[tp] = max(merged.get(tp, value), value)
    return merged


T = TypeVar("T")
_DONE = object()


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Iterate ``items`` in a background thread, ``depth`` items ahead of the consumer.

    Reading Kafka (a Python loop over librdkafka messages) then overlaps with decoding and
    Parquet writing, which run in Arrow without the GIL. Memory stays bounded: at most
    ``depth + 2`` chunks exist at once. An exception in the reader is raised in the consumer.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as error:  # handed to the consumer, which re-raises it
            offer(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # e.g. closes the Kafka consumer when the batch stops early

    thread = threading.Thread(target=pump, name="kafka-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=30)


def decode_and_write(
    chunks: Iterable[RawChunk], decoder: Decoder, rows: IcebergTable, reach: Callable[[str], None] = lambda _: None
) -> Produced:
    """Decode each chunk and write its rows as data files (committed nowhere); every engine's core.

    ``reach`` is called at the ``mid-read`` and ``mid-write`` failpoints of the first chunk.
    """
    files: list[DataFile] = []
    dead: list[pa.Table] = []
    records = nbytes = 0
    timestamps: dict[TopicPartition, int] = {}
    for i, chunk in enumerate(chunks):
        if i == 0:
            reach("mid-read")
        decoded = decoder.decode(chunk)
        records += len(chunk)
        nbytes += chunk.nbytes
        timestamps = _merge_max(
            timestamps, _max_timestamps(decoded.rows, "_kafka_topic", "_kafka_partition", "_kafka_timestamp")
        )
        timestamps = _merge_max(timestamps, _max_timestamps(decoded.dead_letters, "topic", "partition", "timestamp"))
        if i == 0:
            reach("mid-write")
        files.extend(rows.write(decoded.rows))
        dead.append(decoded.dead_letters)
    dead_letters = pa.concat_tables(dead) if dead else DEAD_LETTER_SCHEMA.empty_table()
    return Produced(files, dead_letters, records, nbytes, timestamps)


def merge_timestamps(parts: Iterable[Mapping[TopicPartition, int]]) -> dict[TopicPartition, int]:
    """Newest record timestamp per partition over several engines' results."""
    merged: dict[TopicPartition, int] = {}
    for part in parts:
        merged = _merge_max(merged, part)
    return merged


class LocalEngine:
    """Reads, decodes and writes in this process, one bounded chunk at a time."""

    def __init__(self, config: PipelineConfig, source: KafkaSource, rows: IcebergTable) -> None:
        self.config = config
        self.source = source
        self.rows = rows
        self.decoder = Decoder(config.schema_)

    def produce(self, batch: Batch) -> Produced:
        failpoints.reach("before-read")
        chunks = prefetched(self.source.read(batch.ranges(), self.config.batch.chunk_records))
        produced = decode_and_write(chunks, self.decoder, self.rows, failpoints.reach)
        failpoints.reach("files-written")
        return produced


class Pipeline:
    def __init__(self, config: PipelineConfig, source: KafkaSource, rows: IcebergTable, dead: IcebergTable) -> None:
        self.config = config
        self.source = source
        self.rows = rows
        self.dead = dead
        self.policy = PlanPolicy(
            start=config.start, on_data_loss=config.on_data_loss, max_records=config.batch.max_records
        )

    @classmethod
    def open(cls, config: PipelineConfig) -> Pipeline:
        catalog = connect(config.catalog)
        schema = rows_schema(config.schema_)
        rows = IcebergTable.open(catalog, config.table, schema, partition_spec(schema, config.partition_by))
        dead = IcebergTable.open(catalog, config.dead_letters, dead_letter_schema())
        source = KafkaSource(config.kafka, config.topics, config.group_id, config.batch.read_timeout_s)
        return cls(config, source, rows, dead)

    def on_branch(self, branch: str) -> Pipeline:
        """This pipeline committing rows to ``branch`` (dead letters stay on main: their ledger is a
        floor that deduplicates re-read ranges)."""
        return Pipeline(self.config, self.source, self.rows.on_branch(branch), self.dead)

    def ledger(self, max_age_s: float = 0.0) -> Found | None:
        return observe(self.rows, self.config.pipeline, max_age_s)

    def plan(self, view: KafkaView | None = None) -> Batch:
        # metadata loaded a moment ago (opening the table) is current enough to plan from: if
        # another writer moved the head since, the commit conflicts and observes again
        found = self.ledger(max_age_s=PLAN_FROM_HELD_S)
        return plan_batch(found.ledger if found else None, view or self.source.describe(), self.policy)

    def run_batch(self, engine: Engine | None = None) -> BatchResult:
        """Plan and commit one batch; a fenced batch is planned again up to ``commit.max_replans``."""
        engine = engine or LocalEngine(self.config, self.source, self.rows)
        batch = self.plan()
        for _ in range(self.config.commit.max_replans + 1):
            result = self._attempt(batch, engine)
            if result is not None:
                return result
            log.warning(
                "batch %d of %r was fenced by another writer; planning again",
                batch.number,
                self.config.pipeline,
            )
            fenced = batch
            batch = self.plan()
        observed = self.ledger()
        raise Fenced(
            self.config.pipeline,
            self.config.table,
            fenced.number,
            observed.ledger.batch if observed else None,
        )

    def _attempt(self, batch: Batch, engine: Engine) -> BatchResult | None:
        started = time.monotonic()
        ranges = [(tp.topic, tp.partition, s, e) for tp, s, e in batch.ranges()]
        if not batch.moves_ledger:
            return BatchResult(self.config.pipeline, batch.number - 1, "empty", None, ranges=ranges)
        produced = engine.produce(batch)
        dead = commit_dead_letters(
            self.dead, self.config.pipeline, batch, produced.dead_letters, self.config.commit.max_attempts
        )
        failpoints.reach("between-commits")
        ledger = Ledger(
            batch=batch.number,
            offsets=batch.end,
            start_offsets=batch.start,
            cluster_id=batch.cluster_id,
            timestamps=_merge_max(batch.base.timestamps if batch.base else {}, produced.timestamps),
            lost=batch.lost,
        )
        counts = BatchCounts(
            records=produced.records - produced.dead_letters.num_rows,
            dead_letters=produced.dead_letters.num_rows,
            bytes=produced.nbytes,
        )
        outcome = commit_rows(
            self.rows,
            self.config.pipeline,
            batch,
            ledger,
            produced.files,
            counts,
            self.config.commit.max_attempts,
        )
        if outcome.decision is Decision.FENCED:
            return None
        failpoints.reach("after-commit")
        self.source.commit_advisory(batch.end)
        return BatchResult(
            self.config.pipeline,
            batch.number,
            "committed" if outcome.decision is Decision.COMMIT else "landed",
            outcome.snapshot_id,
            records=counts.records,
            dead_letters=dead if outcome.decision is Decision.COMMIT else 0,
            bytes=produced.nbytes,
            seconds=time.monotonic() - started,
            ranges=ranges,
        )

    def run(
        self, *, until_caught_up: bool, max_batches: int | None, engine: Engine | None = None
    ) -> Iterator[BatchResult]:
        """Batches until the ledger reaches the end offsets seen at start (or ``max_batches``), each
        produced by ``engine`` (default: a :class:`LocalEngine`)."""
        target = {tp: wm.high for tp, wm in self.source.describe().partitions.items()} if until_caught_up else None
        done = 0
        while max_batches is None or done < max_batches:
            result = self.run_batch(engine)
            done += 1
            yield result
            if target is None or result.status == "empty":
                return
            found = self.ledger(max_age_s=PLAN_FROM_HELD_S)
            if found is not None and all(found.ledger.offsets.get(tp, 0) >= end for tp, end in target.items()):
                return
