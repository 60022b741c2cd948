"""Batch planning: from the committed ledger and what Kafka holds now, the next batch's ranges.

Pure: the caller passes what it read from Kafka (:class:`KafkaView`) and gets a :class:`Batch`
or a domain error. Offsets are "next offset to read"; ranges are half-open ``[start, end)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ingest.core.ledger import Ledger, LostRange, TopicPartition, carried, carried_origin, reads_after
from ingest.errors import DataLoss, TopicIdChanged, TopicRecreated

#: where a pipeline's first batch starts: the earliest or latest offsets, or (a timestamp in
#: milliseconds) the first offsets at or after that time, looked up in Kafka's time index
StartPosition = Literal["earliest", "latest"] | int
DataLossPolicy = Literal["fail", "skip"]


@dataclass(frozen=True)
class Watermarks:
    """``low``: earliest retained offset; ``high``: end of readable data (last stable offset);
    ``log_end``: end of every record, those of open transactions too (Kafka's high watermark), or
    None where it was not read (then taken to be ``high``)."""

    low: int
    high: int
    log_end: int | None = None

    @property
    def written_end(self) -> int:
        """The end of all the records the partition holds, readable or not yet."""
        return self.high if self.log_end is None else self.log_end


@dataclass(frozen=True)
class KafkaView:
    cluster_id: str | None
    partitions: Mapping[TopicPartition, Watermarks]
    #: each topic's Kafka topic id (its printable form); a topic Kafka gave no id for is absent
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    #: when the end offsets were read (ms since epoch, the reader's clock, taken just before the
    #: requests): every record written by then lies below them. None: not known
    read_at_ms: int | None = None


@dataclass(frozen=True)
class PlanPolicy:
    start: StartPosition = "earliest"
    on_data_loss: DataLossPolicy = "fail"
    max_records: int = 500_000


@dataclass(frozen=True)
class Batch:
    """One planned batch: ranges ``[start[tp], end[tp])`` for every known partition."""

    number: int
    #: the ledger this batch was planned from (None: the pipeline's first batch)
    base: Ledger | None
    start: Mapping[TopicPartition, int]
    end: Mapping[TopicPartition, int]
    cluster_id: str | None
    lost: tuple[LostRange, ...] = field(default=())
    #: set when this "batch" is a reset: a ledger move without data (see ``ingest.ops.reset``)
    reset_id: str | None = None
    #: the topic ids its ledger records (those of the topics it has offsets of)
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    #: the partitions whose end reaches all Kafka held at plan time, with when that was read (ms)
    caught_up: Mapping[TopicPartition, int] = field(default_factory=dict)

    def ranges(self) -> list[tuple[TopicPartition, int, int]]:
        """The non-empty ranges, in partition order."""
        return [(tp, self.start[tp], self.end[tp]) for tp in sorted(self.end) if self.end[tp] > self.start[tp]]

    def ledger(self, timestamps: Mapping[TopicPartition, int] | None = None) -> Ledger:
        """The ledger a commit of this batch carries: its end offsets, what it skipped, the resets
        its base remembers, its topic ids, when each partition was last read to its end (this
        batch's plan, else as its base says), and ``timestamps`` (newest committed record time per
        partition)."""
        earlier = self.base.caught_up if self.base is not None else {}
        return Ledger(
            batch=self.number,
            offsets=self.end,
            start_offsets=self.start,
            cluster_id=self.cluster_id,
            timestamps=dict(timestamps or {}),
            lost=self.lost,
            reset_id=self.reset_id,
            resets=carried(self.base),
            origin=carried_origin(self.base, self.start),
            read=reads_after(self.base, self.start, self.end),
            topic_ids=self._recorded_ids(),
            caught_up={tp: when for tp, when in {**earlier, **self.caught_up}.items() if tp in self.end},
        )

    def ending_before(self, first: Mapping[TopicPartition, int]) -> Batch | None:
        """This batch ending at ``first[tp]`` in each partition whose range holds that offset (the
        record there and those after it are left to the next batch); None if that leaves nothing
        to read or cuts nothing."""
        end = dict(self.end)
        for tp, at in first.items():
            if tp in end and self.start.get(tp, end[tp]) <= at < end[tp]:
                end[tp] = at
        # a partition cut short was not read to the end Kafka held: it is not complete through then
        cut = replace(self, end=end, caught_up={tp: t for tp, t in self.caught_up.items() if end[tp] == self.end[tp]})
        if end == dict(self.end) or not cut.ranges():
            return None
        return cut

    def _recorded_ids(self) -> dict[str, str]:
        topics = {tp.topic for tp in self.end}
        return {topic: topic_id for topic, topic_id in self.topic_ids.items() if topic in topics}

    @property
    def planned_records(self) -> int:
        """Upper bound on records: offsets are not contiguous (markers, aborted, compacted)."""
        return sum(end - start for _, start, end in self.ranges())

    @property
    def moves_ledger(self) -> bool:
        """Whether committing this batch changes the ledger at all (data, skipped loss, new partitions)."""
        if self.base is None:
            # the first batch always pins the start position, even with nothing to read
            return bool(self.end)
        return dict(self.end) != dict(self.base.offsets) or bool(self.lost)


def fair_caps(available: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Split ``limit`` records across partitions by water-filling: no partition starves another.

    Each partition gets ``min(available, share)``; what small partitions leave over is shared by
    the rest. Deterministic (remainders go to partitions in sorted order).
    """
    caps = {tp: 0 for tp in available}
    pending = sorted(tp for tp, n in available.items() if n > 0)
    budget = limit
    while pending and budget > 0:
        share, extra = divmod(budget, len(pending))
        if share == 0:
            for tp in pending[:extra]:
                caps[tp] += 1
            break
        still = []
        for tp in pending:
            grant = min(share, available[tp] - caps[tp])
            caps[tp] += grant
            budget -= grant
            if caps[tp] < available[tp]:
                still.append(tp)
        pending = still
    return caps


def changed_topics(ledger: Ledger | None, kafka: KafkaView) -> list[tuple[str, str, str]]:
    """The topics whose Kafka id is not the one ``ledger`` recorded, as (topic, id in the ledger, id
    in Kafka): each was deleted and created again under its name since. A topic without an id on
    either side (a ledger written before ids were kept, a broker that gives none) is not among them."""
    if ledger is None:
        return []
    return [
        (topic, recorded, kafka.topic_ids[topic])
        for topic, recorded in sorted(ledger.topic_ids.items())
        if kafka.topic_ids.get(topic, recorded) != recorded
    ]


def check_topic_ids(ledger: Ledger | None, kafka: KafkaView) -> None:
    """Refuse (:class:`~ingest.errors.TopicIdChanged`) a ledger whose topics Kafka now knows by
    other ids: its offsets belong to deleted topics, whatever the new ones hold."""
    changed = changed_topics(ledger, kafka)
    if changed:
        names = {topic for topic, _, _ in changed}
        earliest = [
            (tp.topic, tp.partition, wm.low) for tp, wm in sorted(kafka.partitions.items()) if tp.topic in names
        ]
        raise TopicIdChanged(changed, earliest)


def plan_batch(
    ledger: Ledger | None,
    kafka: KafkaView,
    policy: PlanPolicy,
    from_time: Mapping[TopicPartition, int] | None = None,
) -> Batch:
    """Plan the next batch, failing on data loss (unless ``skip``) and on recreated topics: a topic
    whose id is not the ledger's, or (where either has no id) one that lost partitions or ends below
    the ledger's offsets.

    ``from_time``: for a first batch whose ``policy.start`` is a timestamp, the offsets Kafka's time
    index gives for it (the end offset where no record is that recent)."""
    if ledger is None and isinstance(policy.start, int) and from_time is None:
        raise ValueError("a first batch starting at a timestamp needs the offsets for that time")
    if ledger is not None and ledger.cluster_id and kafka.cluster_id and ledger.cluster_id != kafka.cluster_id:
        raise TopicRecreated(
            f"Kafka cluster id changed: the ledger was written against cluster {ledger.cluster_id!r}, "
            f"the brokers now report {kafka.cluster_id!r}. The offsets in the ledger do not apply to this "
            "cluster. Point `kafka.bootstrap.servers` at the original cluster, or start a new pipeline id."
        )
    check_topic_ids(ledger, kafka)
    known = dict(ledger.offsets) if ledger is not None else {}
    viewed = {tp.topic for tp in kafka.partitions}
    # a topic no longer configured keeps its offsets in the ledger, so adding it back resumes exactly
    idle = {tp: offset for tp, offset in known.items() if tp.topic not in viewed}
    missing = sorted(set(known) - set(kafka.partitions) - set(idle))
    if missing:
        raise TopicRecreated(
            f"partitions {', '.join(map(str, missing))} are in the ledger but no longer in Kafka: the topic was "
            "deleted or recreated with fewer partitions. Offsets cannot be trusted; start a new pipeline id."
        )
    start: dict[TopicPartition, int] = dict(idle)
    lost: list[LostRange] = []
    for tp, wm in sorted(kafka.partitions.items()):
        if tp not in known:
            # the pipeline's first batch uses the configured position; partitions added later
            # start at earliest so nothing written to them is missed
            if ledger is None and from_time is not None:
                start[tp] = min(max(from_time.get(tp, wm.high), wm.low), wm.high)
            else:
                start[tp] = wm.high if (ledger is None and policy.start == "latest") else wm.low
            continue
        offset = known[tp]
        if offset > wm.high:
            raise TopicRecreated(
                f"{tp}: the ledger resumes at offset {offset} but the partition ends at {wm.high}: the topic "
                "was deleted and recreated. The ledger's offsets do not apply to it; start a new pipeline id "
                "or reset the ledger."
            )
        if offset < wm.low:
            if policy.on_data_loss == "fail":
                raise DataLoss(tp.topic, tp.partition, offset, wm.low)
            lost.append(LostRange(tp, offset, wm.low))
            offset = wm.low
        start[tp] = offset
    available = {tp: kafka.partitions[tp].high - start[tp] if tp in kafka.partitions else 0 for tp in start}
    caps = fair_caps(available, policy.max_records)
    end = {tp: start[tp] + caps[tp] for tp in start}
    # read to the end of all it held when the view was taken: complete through that time. Not so
    # behind an open transaction (its records, written earlier, become readable later)
    read_at = kafka.read_at_ms
    caught_up = (
        {} if read_at is None else {tp: read_at for tp, wm in kafka.partitions.items() if end[tp] >= wm.written_end}
    )
    return Batch(
        number=(ledger.batch + 1) if ledger is not None else 1,
        base=ledger,
        start=start,
        end=end,
        cluster_id=kafka.cluster_id,
        lost=tuple(lost),
        topic_ids={**(ledger.topic_ids if ledger is not None else {}), **kafka.topic_ids},
        caught_up=caught_up,
    )
