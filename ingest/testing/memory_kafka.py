"""A Kafka source and a Schema Registry in memory (:class:`ingest.ports.Source`,
:class:`ingest.ports.SchemaRegistry`): what the batch loop asks of Kafka and of the registry,
answered from partitions and subjects a test moves as its model says."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from ingest.core.ledger import TopicPartition
from ingest.core.plan import KafkaView, Watermarks
from ingest.errors import SubjectNotFound
from ingest.ports import WriterSchema


class MemorySource:
    """Partitions of one cluster: each a range of offsets ``[low, high)`` whose records carry
    timestamps (ms) as :meth:`produce` gave them, and the advisory offsets a pipeline committed."""

    def __init__(self, cluster_id: str = "memory-cluster", topic_ids: Mapping[str, str] | None = None) -> None:
        self.cluster_id = cluster_id
        self.topic_ids = dict(topic_ids or {})
        self.partitions: dict[TopicPartition, Watermarks] = {}
        #: each partition's record timestamps from offset ``low`` on, in offset order
        self._times: dict[TopicPartition, list[int]] = {}
        #: what :meth:`commit_advisory` was last told (what a consumer group's lag would show)
        self.advised: dict[TopicPartition, int] = {}

    def produce(self, tp: TopicPartition, count: int, timestamp_ms: int = 0) -> None:
        """``count`` more records on ``tp`` (created empty if new), each at ``timestamp_ms``."""
        marks = self.partitions.get(tp, Watermarks(0, 0))
        self.partitions[tp] = Watermarks(marks.low, marks.high + count)
        times = self._times.setdefault(tp, [])
        times.extend([max(timestamp_ms, times[-1] if times else timestamp_ms)] * count)

    def retain_from(self, tp: TopicPartition, low: int) -> None:
        """Retention removed the records of ``tp`` below ``low``."""
        marks = self.partitions[tp]
        dropped = min(low, marks.high) - marks.low
        if dropped > 0:
            self.partitions[tp] = Watermarks(marks.low + dropped, marks.high)
            del self._times[tp][:dropped]

    def describe(self) -> KafkaView:
        return KafkaView(self.cluster_id, dict(self.partitions), dict(self.topic_ids))

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        return {tp: self.partitions[tp].low + bisect.bisect_left(self._times.get(tp, []), timestamp_ms) for tp in tps}

    def commit_advisory(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.advised.update(offsets)


class MemoryRegistry:
    """Writer schemas by id, and the versions of each subject, as :meth:`register` gave them."""

    def __init__(self) -> None:
        self._schemas: dict[int, WriterSchema] = {}
        self._subjects: dict[str, list[int]] = {}

    def register(self, subject: str, schema: WriterSchema) -> None:
        """``schema`` (under its own id) as the latest version of ``subject``."""
        self._schemas[schema.schema_id] = schema
        self._subjects.setdefault(subject, []).append(schema.schema_id)

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self._schemas.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        versions = self._subjects.get(subject)
        if not versions:
            raise SubjectNotFound(f"the Schema Registry has no subject {subject!r}")
        return self._schemas[versions[-1]]
