"""Kafka as the pipeline sees it: the view a batch is planned from, and exact range reads.

:class:`KafkaSource` is the one object the pipeline, the engines and the operations talk to Kafka
through. It describes the configured topics (the cluster's id, each topic's id, every partition's
watermarks as a ``read_committed`` reader sees them, and when they were read), reads exact offset
ranges ``[start, end)`` (:mod:`ingest.kafka.reading`), and answers the operations' questions: the
backlog past the consumer group's offsets, the offsets at a time, each topic's largest record
batch, and the group's advisory offsets for lag dashboards (:mod:`ingest.kafka.advisory`). Its
clients, and the errors Kafka's failures become, are :mod:`ingest.kafka.clients`.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection, Uuid
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from ingest.core.ledger import TopicPartition
from ingest.core.plan import KafkaView, Watermarks
from ingest.core.ranges import Range
from ingest.errors import BrokerUnavailable, KafkaRefused, TopicNotFound
from ingest.kafka.advisory import AdvisoryOffsets
from ingest.kafka.clients import REFUSED_HINT, TOPIC_REFUSALS, Clients
from ingest.kafka.reading import READ_CHUNK_BYTES, READ_CHUNK_RECORDS, Stops, read_ranges
from ingest.kafka.settings import consumer_config, receive_limit
from ingest.ports import TopicMatcher
from ingest.records import RawChunk

log = logging.getLogger(__name__)

#: how long every bootstrap broker may refuse connections before the cluster counts as unreachable
#: (a broker that accepts but answers slowly is given ``batch.read_timeout_s``)
UNREACHABLE_S = 5.0
#: why a topic's configuration may not be read (DescribeConfigs): not allowed, or not implemented
UNREADABLE_CONFIGS = (*TOPIC_REFUSALS, KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE)


class KafkaSource:
    """Kafka as the pipeline sees it: a view of partitions and exact range reads."""

    def __init__(
        self, props: Mapping[str, Any], topics: Sequence[str] | TopicMatcher, group_id: str, timeout_s: float
    ) -> None:
        #: the topics listed, or a pattern that names them anew at each :meth:`describe`
        self.topics: list[str] | TopicMatcher = list(topics) if isinstance(topics, Sequence) else topics
        self.timeout_s = timeout_s
        self._clients = Clients(props, group_id, timeout_s)
        self._advisory = AdvisoryOffsets(self._clients.admin, group_id, timeout_s)

    def check_clients(self) -> int:
        """Build the clients a run builds (the admin client is built with the source, the consumer
        here, and closed): a property librdkafka does not know or refuses is the
        :class:`~ingest.errors.ConfigError` a run raises. Returns the consumer's receive limit."""
        self._clients.consumer().close()
        return receive_limit(consumer_config(self._clients.props, self._clients.group_id))

    def max_message_bytes(self, topics: Sequence[str]) -> dict[str, int]:
        """Each topic's ``max.message.bytes``, the largest record batch it accepts (DescribeConfigs);
        a topic whose configuration this client may not read is left out."""
        from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

        if not topics:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
        found: dict[str, int] = {}
        for resource, future in self._clients.admin.describe_configs(resources, request_timeout=self.timeout_s).items():
            try:
                entry = future.result().get("max.message.bytes")
            except KafkaException as error:
                cause = error.args[0] if error.args else None
                if isinstance(cause, KafkaError) and cause.code() in UNREADABLE_CONFIGS:
                    continue
                raise self._clients.failed(
                    f"reading the configuration of topic {resource.name!r} failed", error
                ) from None
            if entry is not None and entry.value is not None:
                found[resource.name] = int(entry.value)
        return found

    def describe(self) -> KafkaView:
        """Cluster id, topic ids, partitions and their offsets (low, last stable, end of all records,
        and when the ends were read) of the configured topics (those that match the pattern now,
        with ``topics_pattern:``)."""
        metadata = self._metadata()
        tps: list[TopicPartition] = []
        matcher = self.topics
        if isinstance(matcher, list):
            topics = matcher
        else:
            topics = sorted(name for name in metadata.topics if matcher.matches(name))
            if not topics:
                log.warning(
                    "no topic on %s matches topics_pattern %r: nothing to read", self._clients.servers, matcher.pattern
                )
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                code = info.error.code() if info is not None and info.error is not None else None
                if code in TOPIC_REFUSALS:
                    raise KafkaRefused(
                        f"Kafka at {self._clients.servers} does not let this client read topic "
                        f"{topic!r}: {info.error}. " + REFUSED_HINT  # type: ignore[union-attr]
                    )
                if code not in (None, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise BrokerUnavailable(f"metadata for topic {topic!r} failed: {info.error}")  # type: ignore[union-attr]
                raise TopicNotFound(
                    f"topic {topic!r} does not exist on {self._clients.servers}; create it or fix `topics:`"
                )
            tps.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
        # the four requests go out together: a plan waits for one round trip, not four
        ids = self._ask_topic_ids(topics)
        low = self._ask_offsets(tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        # every record written before this moment lies below the ends read next
        read_at_ms = time.time_ns() // 1_000_000
        written = self._ask_offsets(tps, OffsetSpec.latest(), committed=False)  # type: ignore[no-untyped-call]
        high = self._ask_offsets(tps, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        lows, ends, highs = self._offsets(low), self._offsets(written), self._offsets(high)
        return KafkaView(
            cluster_id=metadata.cluster_id,
            partitions={tp: Watermarks(lows[tp], max(lows[tp], highs[tp]), ends[tp]) for tp in tps},
            topic_ids=self._topic_ids(topics, ids),
            read_at_ms=read_at_ms,
        )

    def _ask_topic_ids(self, topics: Sequence[str]) -> dict[str, Future[Any]]:
        """The request for :meth:`_topic_ids`, sent."""
        if not topics:
            return {}
        try:
            return self._clients.admin.describe_topics(TopicCollection(list(topics)), request_timeout=self.timeout_s)
        except KafkaException as error:
            raise self._clients.failed(f"describing topics failed on {self._clients.servers}", error) from None

    def _topic_ids(self, topics: Sequence[str], asked: Mapping[str, Future[Any]]) -> dict[str, str]:
        """Each topic's id, in Kafka's printable form (what ``kafka-topics.sh --describe`` shows). The
        metadata librdkafka's ``list_topics`` returns has no ids; ``describe_topics`` has them. A
        broker too old to give ids answers the zero id: that topic is left out."""
        try:
            found = {name: _printable(future.result().topic_id) for name, future in asked.items()}
        except KafkaException as error:
            cause = error.args[0] if error.args else None
            code = cause.code() if isinstance(cause, KafkaError) else None
            where = self._clients.servers
            if code in TOPIC_REFUSALS:
                raise KafkaRefused(
                    f"Kafka at {where} does not let this client describe the topics: {error}. " + REFUSED_HINT
                ) from None
            if code == KafkaError.UNKNOWN_TOPIC_OR_PART:  # deleted since the metadata was read
                raise BrokerUnavailable(
                    f"a topic of {', '.join(topics)} was deleted while the batch was planned ({error}). "
                    "Nothing was committed; run again."
                ) from None
            raise self._clients.failed(f"describing topics failed on {where}", error) from None
        return {name: topic_id for name, topic_id in found.items() if topic_id is not None}

    def _metadata(self) -> Any:
        """The cluster's metadata: waits ``timeout_s`` for a broker that answers slowly, but gives up
        after :data:`UNREACHABLE_S` when every bootstrap broker refuses connections."""
        deadline = time.monotonic() + self.timeout_s
        # an earlier request's refusal (an earlier tick of `run --every`) is not this one's
        self._clients.refusals.clear()
        while True:
            self._clients.all_down = False
            try:
                return self._clients.admin.list_topics(
                    timeout=max(0.1, min(UNREACHABLE_S, deadline - time.monotonic()))
                )
            except KafkaException as error:
                self._clients.admin.poll(0)  # serves error_cb
                if self._clients.all_down or self._clients.refusals or time.monotonic() >= deadline - 0.1:
                    waited = self.timeout_s - max(0.0, deadline - time.monotonic())
                    raise self._clients.failed(
                        f"cannot reach Kafka at {self._clients.servers} (waited {waited:.0f}s"
                        + (", every broker refused the connection)" if self._clients.all_down else ")"),
                        error,
                    ) from None

    def backlog(self) -> int:
        """Records past the consumer group's offsets (the low watermark where it has none), over
        every partition: what the next batches will read if the group's offsets are the pipeline's
        own, as they are after each of its batches. A guess, for deciding when to start workers;
        what a batch reads is planned from the table's ledger."""
        view = self.describe()
        # a consumer's committed(), not the admin client's list_consumer_group_offsets: librdkafka
        # (2.16 too) crashes the process with SIGSEGV when the broker answers that admin request
        # with NOT_COORDINATOR (librdkafka#5040; seen here on Apache Kafka 4.4 after a partition
        # was added), while a consumer handles that answer by looking for the coordinator again
        consumer = self._clients.consumer()
        try:
            found = consumer.committed([KafkaTP(tp.topic, tp.partition) for tp in view.partitions], self.timeout_s)
            stored = {TopicPartition(tp.topic, tp.partition): tp.offset for tp in found}
        except KafkaException as error:
            raise self._clients.failed(f"reading consumer group {self._clients.group_id!r} failed", error) from None
        finally:
            consumer.close()
        return sum(
            marks.high - min(max(stored.get(tp, -1), marks.low), marks.high) for tp, marks in view.partitions.items()
        )

    def _ask_offsets(
        self, tps: list[TopicPartition], spec: OffsetSpec, committed: bool = True
    ) -> dict[KafkaTP, Future[Any]]:
        """The request for offsets by ``spec`` (:meth:`_offsets`), sent: as a read_committed reader
        sees them (``committed=False``: counting records of open transactions too)."""
        from confluent_kafka import IsolationLevel

        if not tps:
            return {}
        request = {KafkaTP(tp.topic, tp.partition): spec for tp in tps}
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        try:
            return self._clients.admin.list_offsets(request, isolation_level=isolation, request_timeout=self.timeout_s)
        except KafkaException as error:
            raise self._clients.failed(f"listing offsets failed on {self._clients.servers}", error) from None

    def _offsets(self, asked: Mapping[KafkaTP, Future[Any]]) -> dict[TopicPartition, int]:
        """The offsets :meth:`_ask_offsets` asked for."""
        try:
            found = {TopicPartition(k.topic, k.partition): f.result().offset for k, f in asked.items()}
        except KafkaException as error:
            raise self._clients.failed(f"listing offsets failed on {self._clients.servers}", error) from None
        # a partition without a reachable leader can come back as OFFSET_INVALID (-1001) rather than
        # as an error; taken for an offset it would look like a recreated topic or lost data
        unknown = sorted(str(tp) for tp, offset in found.items() if offset < 0)
        if unknown:
            where = self._clients.servers
            raise self._clients.failed(
                f"Kafka at {where} returned no offset for {', '.join(unknown)} (no leader reachable?)"
            )
        return found

    def read(
        self,
        ranges: Sequence[Range] | Stops,
        chunk_records: int = READ_CHUNK_RECORDS,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> Iterator[RawChunk]:
        """Every record at offsets ``[start, end)`` of each range, in chunks of about ``chunk_records``
        records or ``chunk_bytes`` bytes of values, whichever comes first. Given :class:`Stops`,
        the read also ends each range where another thread has since moved its end (see
        :mod:`ingest.kafka.reading`)."""
        return read_ranges(self._clients, ranges, chunk_records, chunk_bytes)

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        """Per partition, the first offset whose record timestamp is at or after ``timestamp_ms``
        (the end offset where there is none)."""
        consumer = self._clients.consumer()
        try:
            found = consumer.offsets_for_times(
                [KafkaTP(tp.topic, tp.partition, timestamp_ms) for tp in tps], timeout=self.timeout_s
            )
        except KafkaException as error:
            raise self._clients.failed(f"looking up offsets for timestamp {timestamp_ms} failed", error) from None
        finally:
            consumer.close()
        return {TopicPartition(str(t.topic), t.partition): t.offset for t in found}

    def commit_advisory(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Consumer-group offsets for lag dashboards, sent without waiting for Kafka's answer
        (:mod:`ingest.kafka.advisory`): never read back; failures are only logged."""
        self._advisory.commit(offsets)

    def flush_advisory(self) -> None:
        """Wait a few seconds at most for the advisory offsets still unsent (a run's end)."""
        self._advisory.flush()


def _printable(topic_id: Uuid | None) -> str | None:
    """A topic id as Kafka prints it (its 16 bytes in URL-safe base64, unpadded: Java's
    ``Uuid.toString``; librdkafka's ``str()`` uses the other base64 alphabet); None for the zero id."""
    if topic_id is None:
        return None
    # (confluent-kafka's type stubs leave these two methods out)
    high = topic_id.get_most_significant_bits()  # type: ignore[attr-defined]
    low = topic_id.get_least_significant_bits()  # type: ignore[attr-defined]
    if high == low == 0:
        return None
    raw = high.to_bytes(8, "big", signed=True) + low.to_bytes(8, "big", signed=True)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
