"""What users ask of a pipeline: its status (lag) and its history (batches); ``ingest verify`` is
:mod:`ingest.ops.verify`.

Each function returns a frozen result; ``as_dict()`` is its ``--json`` form, and the CLI renders it
for people (:mod:`ingest.render`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from ingest import records
from ingest.assembly import Opened
from ingest.config import PipelineConfig
from ingest.core.ledger import Found, TopicPartition
from ingest.core.ledger_codec import decode, decode_counts, read_extra
from ingest.core.plan import KafkaView
from ingest.iceberg.reading import dead_letters_of
from ingest.kafka.source import KafkaSource


@dataclass(frozen=True)
class Span:
    """Offsets ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @classmethod
    def of(cls, tp: TopicPartition, start: int, end: int) -> Span:
        return cls(tp.topic, tp.partition, start, end)

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    #: the ledger's next offset to read (None: the pipeline has not committed this partition)
    committed: int | None
    low: int
    end: int

    @property
    def lag(self) -> int:
        return self.end - (self.committed if self.committed is not None else self.low)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "low": self.low,
            "end": self.end,
            "lag": self.lag,
        }


#: the newest dead letters whose reasons ``status`` counts
NEWEST_DEAD_LETTERS = 1_000


@dataclass(frozen=True)
class DeadLetterCount:
    """The pipeline's dead letters, for ``status``: how many, and why the newest are."""

    count: int
    #: the Kafka timestamp of the newest (ms since epoch)
    newest_ms: int | None = None
    #: the commonest reasons among the newest :data:`NEWEST_DEAD_LETTERS`, with their counts
    reasons: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "newest_ms": self.newest_ms, "reasons": [list(r) for r in self.reasons]}


@dataclass(frozen=True)
class Status:
    """``ingest status``: where the ledger is, per partition against Kafka's end, and the dead letters."""

    pipeline: str
    table: str
    batch: int | None
    snapshot_id: int | None
    valid_through_ms: int | None
    partitions: tuple[PartitionLag, ...]
    #: why there is no ledger to show, when there cannot be one (the tables do not exist yet)
    note: str | None = None
    dead_letters: DeadLetterCount = DeadLetterCount(0)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "table": self.table,
            "batch": self.batch,
            "snapshot_id": self.snapshot_id,
            "valid_through_ms": self.valid_through_ms,
            "lag": self.lag,
            "partitions": [p.as_dict() for p in self.partitions],
            "dead_letters": self.dead_letters.as_dict(),
            **({"note": self.note} if self.note else {}),
        }


def status(pipeline: Opened) -> Status:
    found = pipeline.ledger()
    view = pipeline.source.describe()
    return replace(_status(pipeline.config, view, found), dead_letters=dead_letter_count(pipeline, found))


def dead_letter_count(pipeline: Opened, found: Found | None) -> DeadLetterCount:
    """The pipeline's dead letters (those of its topics, as of ledger ``found``) on its dead-letter table's main."""
    d = records.DEAD_LETTERS
    pipeline.dead.refresh()
    topics = pipeline.config.topics_in(found.ledger.topics if found is not None else ())
    dead = dead_letters_of(pipeline.dead, topics, [d.timestamp, d.offset, "error"])
    if dead.num_rows == 0:
        return DeadLetterCount(0)
    newest = dead.sort_by([(d.timestamp, "descending"), (d.offset, "descending")]).slice(0, NEWEST_DEAD_LETTERS)
    stamp = newest.column(d.timestamp)[0]
    reasons = Counter(newest.column("error").to_pylist()).most_common(3)
    return DeadLetterCount(
        dead.num_rows, int(stamp.value // 1000) if stamp.is_valid else None, tuple((r, n) for r, n in reasons)
    )


def status_before_tables(config: PipelineConfig, source: KafkaSource) -> Status:
    """The status of a pipeline whose tables do not exist yet (no run created them): all of Kafka to read."""
    return _status(config, source.describe(), None, note=f"table {config.table} does not exist yet: nothing committed")


def _status(config: PipelineConfig, view: KafkaView, found: Found | None, note: str | None = None) -> Status:
    committed = dict(found.ledger.offsets) if found else {}
    return Status(
        config.pipeline,
        config.table,
        found.ledger.batch if found else None,
        found.snapshot_id if found else None,
        found.ledger.valid_through if found else None,
        tuple(
            PartitionLag(tp.topic, tp.partition, committed.get(tp), wm.low, wm.high)
            for tp, wm in sorted(view.partitions.items())
        ),
        note,
    )


@dataclass(frozen=True)
class BatchEntry:
    """One of ``ingest history``'s batches: a snapshot that carries this pipeline's ledger."""

    snapshot_id: int
    timestamp_ms: int
    batch: int
    records: int
    dead_letters: int
    bytes: int
    valid_through_ms: int | None
    #: the partitions the batch read (a reset or a new partition moves the ledger without data)
    ranges: tuple[Span, ...]
    #: ranges lost to retention that ``on_data_loss: skip`` recorded
    lost: tuple[Span, ...]
    #: ``ingest redrive``: the dead letters this snapshot committed to the rows (it read no range)
    redriven: tuple[Span, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.snapshot_id,
            "timestamp_ms": self.timestamp_ms,
            "batch": self.batch,
            "records": self.records,
            "dead_letters": self.dead_letters,
            "bytes": self.bytes,
            "valid_through_ms": self.valid_through_ms,
            "ranges": [r.as_dict() for r in self.ranges],
            "lost": [r.as_dict() for r in self.lost],
            "redriven": [r.as_dict() for r in self.redriven],
        }


def history(pipeline: Opened, limit: int | None = None) -> list[BatchEntry]:
    """This pipeline's snapshots on the main branch, newest first."""
    name = pipeline.config.pipeline
    pipeline.rows.refresh()
    entries: list[BatchEntry] = []
    for snap in pipeline.rows.ancestry():
        ledger = decode(name, snap.summary)
        if ledger is None or read_extra(name, snap.summary, "restamped-by"):
            continue  # not this pipeline's, or maintenance carrying its ledger forward
        counts = decode_counts(name, snap.summary)
        entries.append(
            BatchEntry(
                snap.snapshot_id,
                snap.timestamp_ms,
                ledger.batch,
                counts.records,
                counts.dead_letters,
                counts.bytes,
                ledger.valid_through,
                tuple(
                    Span.of(tp, ledger.start_offsets.get(tp, end), end)
                    for tp, end in sorted(ledger.offsets.items())
                    if ledger.start_offsets.get(tp, end) != end
                ),
                tuple(Span.of(r.tp, r.start, r.end) for r in ledger.lost),
                tuple(
                    Span.of(tp, lo, hi)
                    for tp, spans in sorted(((ledger.sync.redriven if ledger.sync else None) or {}).items())
                    for lo, hi in spans
                ),
            )
        )
        if limit is not None and len(entries) >= limit:
            break
    return entries
