"""The ledger: per topic-partition, the **next offset to read** (last consumed + 1).

Every range in this project is half-open, ``[start, end)``; an offset stored anywhere means "the next
offset to read". This module holds the ledger as values: the topic-partition, what one pipeline had
committed as of one snapshot (:class:`Ledger`, with the data lost to retention, the resets applied and
the dead-letter marker it carries), a batch's counts, what carries forward from one ledger to the
next, and the snapshot a lookup reads. How a ledger travels in Iceberg snapshot summaries, and the
lookup along a branch's ancestry, is :mod:`ingest.core.ledger_codec`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: how many applied reset ids every ledger carries forward (so a re-run finds them after expiry)
RESET_MEMORY = 50


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


Offsets = Mapping[TopicPartition, int]


@dataclass(frozen=True)
class LostRange:
    """Offsets ``[start, end)`` of a partition that retention deleted before they were read."""

    tp: TopicPartition
    start: int
    end: int


@dataclass(frozen=True)
class AppliedReset:
    """A reset the ledger remembers: its id and, per partition it moved, from where to where
    (``ingest verify`` reads a backward move as a range ingested once more on purpose, a forward
    one as a range skipped on purpose)."""

    reset_id: str
    moves: tuple[tuple[TopicPartition, int, int], ...] = ()


@dataclass(frozen=True)
class DeadLetterSync:
    """A step the dead-letter table owes the rows snapshot that carries this marker.

    The rows table decides which records a pipeline has stored, and its dead-letter table follows:
    a batch's dead letters are added once the batch's rows commit has landed (``files``: the data
    files holding them, written before that commit); after a rollback to a snapshot the dead
    letters its line never read go (``rewind_to``, ``rewind_gaps``:
    :func:`rewind_of`); after a replay's publish the dead-letter table's
    replay branch becomes its main (``branch``); after a redrive the dead letters it moved to the
    rows go (``redriven``). The dead-letter ledger remembers ``sync_id`` once the step is done (as
    an :class:`AppliedReset`), no rows commit is made on top of the marker before that, and the
    step is owed only while the rows branch's ledger carries the marker (see ``ingest.dead_letters``).
    """

    sync_id: str
    branch: str | None = None
    rewind_to: Mapping[TopicPartition, int] | None = None
    #: ``ingest redrive``: the dead letters this snapshot's rows were decoded from, ``[start, end)``
    #: offset ranges per partition, to be removed from the dead-letter table
    redriven: Mapping[TopicPartition, tuple[tuple[int, int], ...]] | None = None
    #: a batch: the data files of its dead letters (written, committed nowhere yet), to be added
    files: tuple[str, ...] | None = None
    #: a batch: how many dead letters ``files`` hold
    count: int = 0
    #: a rollback: below ``rewind_to``, the offset ranges its line never read (a forward reset
    #: skipped them), whose dead letters go too
    rewind_gaps: Mapping[TopicPartition, tuple[tuple[int, int], ...]] | None = None


@dataclass(frozen=True)
class Ledger:
    """What one pipeline had committed as of one snapshot."""

    batch: int
    offsets: Mapping[TopicPartition, int]
    start_offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    cluster_id: str | None = None
    #: newest committed record timestamp per partition (ms since epoch), carried across batches
    timestamps: Mapping[TopicPartition, int] = field(default_factory=dict)
    lost: tuple[LostRange, ...] = ()
    #: the reset that committed this ledger (its snapshot has no data of a batch), if any
    reset_id: str | None = None
    #: the resets applied so far, oldest first, the newest :data:`RESET_MEMORY` of them; every
    #: ledger carries them forward, so a reset stays applied (and verifiable) after its snapshot expired
    resets: tuple[AppliedReset, ...] = ()
    #: what the dead-letter table owes this ledger's snapshot (a rollback's or publish's marker)
    sync: DeadLetterSync | None = None
    #: where reading each partition began (its first ledger's start), carried forward so that
    #: ``verify`` counts reads exactly once the first ledgers are expired; empty in ledgers whose
    #: history began before it was kept
    origin: Mapping[TopicPartition, int] = field(default_factory=dict)
    #: the Kafka topic id of each topic the offsets were read from (Kafka's printable form), carried
    #: forward; a topic deleted and created again under its name has another. Empty for a topic of a
    #: ledger written before ids were kept (format 1 or 2), or where Kafka gave none
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    #: per partition, when (ms since epoch, the pipeline's clock) a batch last read everything Kafka
    #: held of it: the end of all its records, read just after that time, was the batch's end. Its
    #: data is complete through then, however long ago its newest record was written (the
    #: idle-source rule of stream processors); carried forward. Empty in ledgers written before it was kept
    caught_up: Mapping[TopicPartition, int] = field(default_factory=dict)
    #: per partition, the offset ranges this ledger's line of batches has read (merged; a forward
    #: reset leaves a gap, a backward one an overlap), carried forward: what a rollback to it keeps
    #: of the dead letters. None in ledgers written before it was kept
    read: Mapping[TopicPartition, tuple[tuple[int, int], ...]] | None = None

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(tp.topic for tp in self.offsets)

    def remembers(self, reset_id: str) -> bool:
        return any(reset.reset_id == reset_id for reset in self.resets)

    @property
    def complete_through(self) -> dict[TopicPartition, int]:
        """Per partition, the time (ms) its data is complete through: its newest committed record's
        timestamp, or when a batch last read all Kafka held of it, whichever is later."""
        through = dict(self.timestamps)
        for tp, when in self.caught_up.items():
            through[tp] = max(through.get(tp, when), when)
        return through

    @property
    def valid_through(self) -> int | None:
        """Min over partitions of :attr:`complete_through`: all data up to it is in. A partition
        that gets no records does not hold it back once a batch has read it to its end."""
        through = self.complete_through
        return min(through.values()) if through else None


@dataclass(frozen=True)
class BatchCounts:
    records: int = 0
    dead_letters: int = 0
    bytes: int = 0
    #: records with fields the table does not declare (``unknown_fields``)
    unknown_fields: int = 0


def carried(base: Ledger | None) -> tuple[AppliedReset, ...]:
    """The resets a ledger committed on top of ``base`` carries forward."""
    return base.resets if base is not None else ()


def remembering(base: Ledger | None, step_id: str) -> tuple[AppliedReset, ...]:
    """The memory a ledger committed on top of ``base`` carries once it applied ``step_id`` (a
    reset, or a step a marker asked of the dead-letter table): ``base``'s, and ``step_id``."""
    return (*carried(base), AppliedReset(step_id))[-RESET_MEMORY:]


def carried_origin(base: Ledger | None, start: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The origin of a ledger committed on top of ``base`` that reads from ``start``: ``base``'s,
    and ``start`` for partitions new to it (nothing if ``base``'s history began before origins were kept)."""
    if base is None:
        return dict(start)
    if not base.origin:
        return {}
    return {**{tp: o for tp, o in start.items() if tp not in base.origin}, **base.origin}


@dataclass(frozen=True)
class SnapshotView:
    """What the lookup (:func:`ingest.core.ledger_codec.find_ledger`) needs of a snapshot: its id and summary
    properties."""

    snapshot_id: int
    summary: Mapping[str, str]
    timestamp_ms: int = 0
    #: Iceberg's snapshot operation: append, overwrite, replace or delete
    operation: str | None = None


@dataclass(frozen=True)
class Found:
    snapshot_id: int
    ledger: Ledger


def merge_timestamps(parts: Iterable[Mapping[TopicPartition, int]]) -> dict[TopicPartition, int]:
    """Newest record timestamp per partition over several results."""
    merged: dict[TopicPartition, int] = {}
    for part in parts:
        for tp, value in part.items():
            merged[tp] = max(merged.get(tp, value), value)
    return merged


def carried_reads(base: Ledger | None) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    """What ``base``'s line has read: its own record of it, or (a ledger written before it was kept)
    everything below its offsets."""
    if base is None:
        return {}
    if base.read is not None:
        return dict(base.read)
    return {tp: ((0, end),) for tp, end in base.offsets.items() if end > 0}


def reads_after(
    base: Ledger | None, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    """What the line of a batch on ``base`` that reads ``[start, end)`` has read."""
    read = carried_reads(base)
    for tp, stop in end.items():
        begin = start.get(tp, stop)
        if stop > begin:
            read[tp] = _merged([*read.get(tp, ()), (begin, stop)])
    return read


def _merged(spans: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def rewind_of(ledger: Ledger) -> tuple[dict[TopicPartition, int], dict[TopicPartition, tuple[tuple[int, int], ...]]]:
    """Where a rollback (or a replay) to ``ledger`` rewinds the dead letters: per partition, the end
    of what its line has read (above its offsets after a backward reset: the dead letters between are
    the line's own, and the runs that read those records again keep them), and below that the ranges
    it never read (a discarded line may have read them). A ledger written before its reads were
    kept: its offsets, no gaps."""
    if ledger.read is None:
        return dict(ledger.offsets), {}
    to: dict[TopicPartition, int] = {}
    gaps: dict[TopicPartition, tuple[tuple[int, int], ...]] = {}
    for tp in {*ledger.offsets, *ledger.read}:
        spans = ledger.read.get(tp, ())
        to[tp] = spans[-1][1] if spans else 0
        holes = tuple((hi, lo) for (_, hi), (lo, _) in zip(((0, 0), *spans), spans, strict=False) if lo > hi)
        if holes:
            gaps[tp] = holes
    return to, gaps
