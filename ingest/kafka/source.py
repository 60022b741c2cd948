"""Reading Kafka for a batch: its watermarks, and exact offset ranges.

Reads exact offset ranges with ``assign()`` (no group subscription, no auto-commit,
``auto.offset.reset=error``, ``read_committed``). Offsets are not contiguous (transaction markers,
aborted records, compaction), so a partition is done when the consumer's position reaches the
range's end, never when a count of records is reached.
"""

from __future__ import annotations

import base64
import collections
import logging
import operator
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    Uuid,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from ingest.config import TopicPattern
from ingest.core.ledger import TopicPartition
from ingest.core.plan import KafkaView, Watermarks
from ingest.core.ranges import Range
from ingest.errors import BrokerUnavailable, ConfigError, IngestError, KafkaRefused, RecordTooLarge, TopicNotFound
from ingest.records import Headers, RawChunk

T = TypeVar("T")

log = logging.getLogger(__name__)

#: fetch settings for bulk range reads. ``fetch.queue.backoff.ms`` matters most: when a fetch
#: leaves more than ``queued.min.messages`` waiting for a partition, librdkafka's default is to
#: fetch that partition again only a full second later; a reader that drains the queue in
#: milliseconds then idles (docs/performance.md). With that backoff, 20k messages waiting per
#: partition (librdkafka's default: 100k) read as fast, on four partitions and on one, and the
#: process peaks ~20-40 MB lower.
FETCH_DEFAULTS: dict[str, Any] = {
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
    "queued.max.messages.kbytes": 262_144,
    "queued.min.messages": 20_000,
    "fetch.queue.backoff.ms": 10,
}
#: records and value bytes read from Kafka at a time. Raw records cost several hundred bytes of
#: Python objects each; small chunks keep that in the CPU caches and let reading overlap with
#: decoding at a fine grain: faster and smaller than 200k-record chunks (docs/performance.md).
#: Files are sized apart from them (``batch.chunk_records`` rows written together).
READ_CHUNK_RECORDS = 25_000
READ_CHUNK_BYTES = 8 << 20
#: a generous guess of a record's size on the wire, to size fetches for small ranges
FETCH_BYTES_PER_RECORD = 1024
EXACT_READ: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
}
#: what librdkafka reports (to ``error_cb``, while the request itself fails as a mere transport
#: error) when the cluster turns the client away rather than being unreachable
REFUSALS = (KafkaError._AUTHENTICATION, KafkaError._SSL)
#: the same, answered per topic in metadata
TOPIC_REFUSALS = (KafkaError.TOPIC_AUTHORIZATION_FAILED,)
#: how long every bootstrap broker may refuse connections before the cluster counts as unreachable
#: (a broker that accepts but answers slowly is given ``batch.read_timeout_s``)
UNREACHABLE_S = 5.0
#: librdkafka's own log lines (connection failures while it retries, ...): with ``-v`` only, the
#: error that ends the command says what happened
LIBRDKAFKA_LOG = logging.getLogger("ingest.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(lambda record: logging.getLogger().isEnabledFor(logging.INFO))
REFUSED_HINT = (
    "Check `kafka:` in the config: security.protocol, sasl.mechanism, sasl.username and sasl.password "
    "(usually ${ENV} references), ssl.ca.location, and the principal's ACLs. Retrying will not help."
)
#: librdkafka's ``receive.message.max.bytes`` when it is not set (raised to ``fetch.max.bytes`` + 512
#: when that is larger)
RECEIVE_DEFAULT = 100_000_000
#: what a fetch response adds around the record batches it carries (librdkafka's own allowance)
RESPONSE_OVERHEAD = 512
#: how librdkafka reports a response larger than ``receive.message.max.bytes`` (to ``error_cb``,
#: while the connection is dropped and the same fetch fails again and again)
OVERSIZED = re.compile(r"Invalid response size (\d+) \(0\.\.(\d+)\)")
#: why a topic's configuration may not be read (DescribeConfigs): not allowed, or not implemented
UNREADABLE_CONFIGS = (*TOPIC_REFUSALS, KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE)
#: what ``getaddrinfo`` says of a name that does not exist (as opposed to a DNS server not answering)
NO_SUCH_NAME = frozenset({socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)})


def _admin_props(props: Mapping[str, Any]) -> dict[str, Any]:
    consumer_only = {"group.id", *FETCH_DEFAULTS, *EXACT_READ}
    return {k: v for k, v in props.items() if k not in consumer_only and not k.startswith(("fetch.", "max.poll"))}


def consumer_config(props: Mapping[str, Any], group_id: str, sized_for: int | None = None) -> dict[str, Any]:
    """The properties of every consumer a run builds: the fetch settings for bulk range reads under
    the config's own ``kafka:`` properties, and the exact-read settings over both. ``sized_for``
    (records in the largest range) caps the per-partition fetch so a small batch does not pull
    megabytes it will drop."""
    fetch = dict(FETCH_DEFAULTS)
    if sized_for is not None:
        fetch["max.partition.fetch.bytes"] = min(
            FETCH_DEFAULTS["max.partition.fetch.bytes"], max(1 << 20, sized_for * FETCH_BYTES_PER_RECORD)
        )
    return {**fetch, **props, "group.id": group_id, **EXACT_READ}


def receive_limit(conf: Mapping[str, Any]) -> int:
    """The largest response a consumer of ``conf`` (one librdkafka accepted) takes from a broker."""
    if "receive.message.max.bytes" in conf:
        return int(conf["receive.message.max.bytes"])
    return max(RECEIVE_DEFAULT, int(conf.get("fetch.max.bytes", 0)) + RESPONSE_OVERHEAD)


def unresolvable(servers: str) -> str | None:
    """Why no host of ``servers`` (``bootstrap.servers``) can be reached whatever the brokers do: no
    host name in it exists (a typo, a name known only inside another network). None if any host
    resolves, or if a lookup failed in a way that may pass (a DNS server not answering)."""
    reasons = []
    for server in filter(None, (part.strip() for part in servers.split(","))):
        address = server.split("://", 1)[-1]
        host = address[1:].split("]", 1)[0] if address.startswith("[") else address.rsplit(":", 1)[0]
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as error:
            if error.errno not in NO_SUCH_NAME:
                return None
            reasons.append(f"{host!r} ({error.strerror})")
        except (OSError, UnicodeError):
            return None
        else:
            return None  # this one exists
    return ", ".join(reasons) or None


def _built(client: Callable[[dict[str, Any]], T], conf: dict[str, Any]) -> T:
    """A librdkafka client of ``conf``; a property librdkafka does not know, or a value it refuses,
    is a configuration error naming it (librdkafka says which)."""
    try:
        return client({"logger": LIBRDKAFKA_LOG, **conf})
    except KafkaException as error:
        cause = error.args[0] if error.args else None
        if isinstance(cause, KafkaError) and cause.code() == KafkaError._INVALID_ARG:
            raise ConfigError(
                f"kafka: librdkafka refused the configuration: {cause.str()}. Fix `kafka:` in the config (the keys "
                "are librdkafka's, https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)."
            ) from None
        raise


class Stops:
    """Where a read of exact ranges has got to, and where each range ends.

    The reader moves ``position`` (the next offset it will get) forward. Another thread may move
    an ``end`` back to hand the rest of a range to another reader, never below its position, so
    nothing read is taken back. Both change only under ``lock``. Every message the reader was
    given below a range's end is kept: an end moved back drops only what is past it.
    """

    def __init__(self, ranges: Sequence[Range]) -> None:
        self.lock = threading.Lock()
        self.start = {tp: start for tp, start, end in ranges if end > start}
        self.position = dict(self.start)
        self.end = {tp: end for tp, start, end in ranges if end > start}
        if len(self.end) != sum(1 for _, start, end in ranges if end > start):
            raise ValueError(f"two ranges of one partition in {ranges}")

    def unread(self) -> list[Range]:
        """What is left to read, in the order the ranges were given (hold ``lock``)."""
        return [(tp, self.position[tp], end) for tp, end in self.end.items() if self.position[tp] < end]

    def ranges(self) -> list[Range]:
        """The ranges as they now end: once the read is over, exactly what it covered."""
        return [(tp, start, self.end[tp]) for tp, start in self.start.items() if self.end[tp] > start]

    def ends(self) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): end for tp, end in self.end.items()}


class KafkaSource:
    """Kafka as the pipeline sees it: a view of partitions and exact range reads."""

    def __init__(
        self, props: Mapping[str, Any], topics: Sequence[str] | TopicPattern, group_id: str, timeout_s: float
    ) -> None:
        #: the topics listed, or a pattern that names them anew at each :meth:`describe`
        self.topics = topics if isinstance(topics, TopicPattern) else list(topics)
        self.timeout_s = timeout_s
        self._props = dict(props)
        self._group_id = group_id
        #: the latest refusals librdkafka reported, from any of this source's clients
        self._refusals: collections.deque[KafkaError] = collections.deque(maxlen=4)
        self._all_down = False  # every bootstrap broker refused a connection since the last check
        #: (response size, limit) of a response librdkafka dropped as over ``receive.message.max.bytes``
        self._oversized: tuple[int, int] | None = None
        admin: dict[str, Any] = {**_admin_props(props), "socket.timeout.ms": int(timeout_s * 1000)}
        self._admin = _built(AdminClient, {**admin, "error_cb": self._on_error})

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in REFUSALS:
            self._refusals.append(error)
        elif error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._all_down = True
        elif (found := OVERSIZED.search(error.str())) is not None:
            self._oversized = (int(found.group(1)), int(found.group(2)))

    def _failed(self, what: str, error: KafkaException | None = None) -> IngestError:
        """The error to raise when talking to Kafka failed: refused, or no bootstrap host exists (a
        config problem), or unavailable (then nothing of the batch was committed, and running again
        is the fix)."""
        self._admin.poll(0)  # serves error_cb: the reason behind a failed request comes this way
        if self._refusals:
            return KafkaRefused(
                f"Kafka at {self._props['bootstrap.servers']} refused this client: {self._refusals[-1].str()}. "
                + REFUSED_HINT
            )
        servers = self._props["bootstrap.servers"]
        unknown = unresolvable(str(servers)) if self._all_down else None
        if unknown is not None:  # a broker that is down may come back; a name that does not exist will not
            return ConfigError(
                f"kafka.bootstrap.servers: no host of {servers!r} exists: {unknown}. Fix the host names in "
                "`kafka:` (a typo? a name known only inside the cluster's network?); retrying will not help."
            )
        cause = f": {error}" if error is not None else ""
        return BrokerUnavailable(f"{what}{cause}. Nothing was committed; run again when the broker is healthy.")

    def _consumer(self, sized_for: int | None = None) -> Consumer:
        """A consumer for exact reads (see :func:`consumer_config`)."""
        return _built(Consumer, {**consumer_config(self._props, self._group_id, sized_for), "error_cb": self._on_error})

    def check_clients(self) -> int:
        """Build the clients a run builds (the admin client is built with the source, the consumer
        here, and closed): a property librdkafka does not know or refuses is the
        :class:`~ingest.errors.ConfigError` a run raises. Returns the consumer's receive limit."""
        self._consumer().close()
        return receive_limit(consumer_config(self._props, self._group_id))

    def max_message_bytes(self, topics: Sequence[str]) -> dict[str, int]:
        """Each topic's ``max.message.bytes``, the largest record batch it accepts (DescribeConfigs);
        a topic whose configuration this client may not read is left out."""
        from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

        if not topics:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
        found: dict[str, int] = {}
        for resource, future in self._admin.describe_configs(resources, request_timeout=self.timeout_s).items():
            try:
                entry = future.result().get("max.message.bytes")
            except KafkaException as error:
                cause = error.args[0] if error.args else None
                if isinstance(cause, KafkaError) and cause.code() in UNREADABLE_CONFIGS:
                    continue
                raise self._failed(f"reading the configuration of topic {resource.name!r} failed", error) from None
            if entry is not None and entry.value is not None:
                found[resource.name] = int(entry.value)
        return found

    def describe(self) -> KafkaView:
        """Cluster id, topic ids, partitions and their offsets (low, last stable, end of all records,
        and when the ends were read) of the configured topics (those that match the pattern now,
        with ``topics_pattern:``)."""
        metadata = self._metadata()
        tps: list[TopicPartition] = []
        topics = self.topics
        if isinstance(topics, TopicPattern):
            topics = sorted(name for name in metadata.topics if topics.matches(name))
            if not topics:
                log.warning(
                    "no topic on %s matches topics_pattern %r: nothing to read",
                    self._props["bootstrap.servers"],
                    self.topics.pattern,  # type: ignore[union-attr]
                )
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                code = info.error.code() if info is not None and info.error is not None else None
                if code in TOPIC_REFUSALS:
                    raise KafkaRefused(
                        f"Kafka at {self._props['bootstrap.servers']} does not let this client read topic "
                        f"{topic!r}: {info.error}. " + REFUSED_HINT  # type: ignore[union-attr]
                    )
                if code not in (None, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise BrokerUnavailable(f"metadata for topic {topic!r} failed: {info.error}")  # type: ignore[union-attr]
                raise TopicNotFound(
                    f"topic {topic!r} does not exist on {self._props['bootstrap.servers']}; create it or fix `topics:`"
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
            return self._admin.describe_topics(TopicCollection(list(topics)), request_timeout=self.timeout_s)
        except KafkaException as error:
            raise self._failed(f"describing topics failed on {self._props['bootstrap.servers']}", error) from None

    def _topic_ids(self, topics: Sequence[str], asked: Mapping[str, Future[Any]]) -> dict[str, str]:
        """Each topic's id, in Kafka's printable form (what ``kafka-topics.sh --describe`` shows). The
        metadata librdkafka's ``list_topics`` returns has no ids; ``describe_topics`` has them. A
        broker too old to give ids answers the zero id: that topic is left out."""
        try:
            found = {name: _printable(future.result().topic_id) for name, future in asked.items()}
        except KafkaException as error:
            cause = error.args[0] if error.args else None
            code = cause.code() if isinstance(cause, KafkaError) else None
            where = self._props["bootstrap.servers"]
            if code in TOPIC_REFUSALS:
                raise KafkaRefused(
                    f"Kafka at {where} does not let this client describe the topics: {error}. " + REFUSED_HINT
                ) from None
            if code == KafkaError.UNKNOWN_TOPIC_OR_PART:  # deleted since the metadata was read
                raise BrokerUnavailable(
                    f"a topic of {', '.join(topics)} was deleted while the batch was planned ({error}). "
                    "Nothing was committed; run again."
                ) from None
            raise self._failed(f"describing topics failed on {where}", error) from None
        return {name: topic_id for name, topic_id in found.items() if topic_id is not None}

    def _metadata(self) -> Any:
        """The cluster's metadata: waits ``timeout_s`` for a broker that answers slowly, but gives up
        after :data:`UNREACHABLE_S` when every bootstrap broker refuses connections."""
        deadline = time.monotonic() + self.timeout_s
        self._refusals.clear()  # an earlier request's refusal (an earlier tick of `run --every`) is not this one's
        while True:
            self._all_down = False
            try:
                return self._admin.list_topics(timeout=max(0.1, min(UNREACHABLE_S, deadline - time.monotonic())))
            except KafkaException as error:
                self._admin.poll(0)  # serves error_cb
                if self._all_down or self._refusals or time.monotonic() >= deadline - 0.1:
                    waited = self.timeout_s - max(0.0, deadline - time.monotonic())
                    raise self._failed(
                        f"cannot reach Kafka at {self._props['bootstrap.servers']} (waited {waited:.0f}s"
                        + (", every broker refused the connection)" if self._all_down else ")"),
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
        consumer = self._consumer()
        try:
            found = consumer.committed([KafkaTP(tp.topic, tp.partition) for tp in view.partitions], self.timeout_s)
            stored = {TopicPartition(tp.topic, tp.partition): tp.offset for tp in found}
        except KafkaException as error:
            raise self._failed(f"reading consumer group {self._group_id!r} failed", error) from None
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
            return self._admin.list_offsets(request, isolation_level=isolation, request_timeout=self.timeout_s)
        except KafkaException as error:
            raise self._failed(f"listing offsets failed on {self._props['bootstrap.servers']}", error) from None

    def _offsets(self, asked: Mapping[KafkaTP, Future[Any]]) -> dict[TopicPartition, int]:
        """The offsets :meth:`_ask_offsets` asked for."""
        try:
            found = {TopicPartition(k.topic, k.partition): f.result().offset for k, f in asked.items()}
        except KafkaException as error:
            raise self._failed(f"listing offsets failed on {self._props['bootstrap.servers']}", error) from None
        # a partition without a reachable leader can come back as OFFSET_INVALID (-1001) rather than
        # as an error; taken for an offset it would look like a recreated topic or lost data
        unknown = sorted(str(tp) for tp, offset in found.items() if offset < 0)
        if unknown:
            where = self._props["bootstrap.servers"]
            raise self._failed(f"Kafka at {where} returned no offset for {', '.join(unknown)} (no leader reachable?)")
        return found

    def read(
        self,
        ranges: Sequence[Range] | Stops,
        chunk_records: int = READ_CHUNK_RECORDS,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> Iterator[RawChunk]:
        """Every record at offsets ``[start, end)`` of each range, in chunks of about ``chunk_records``
        records or ``chunk_bytes`` bytes of values, whichever comes first. Given :class:`Stops`,
        the read also ends each range where another thread has since moved its end."""
        stops = ranges if isinstance(ranges, Stops) else Stops(ranges)
        if not stops.end:
            return
        self._oversized = None  # what an earlier request met is not this read's
        consumer = self._consumer(sized_for=max(end - stops.start[tp] for tp, end in stops.end.items()))
        try:
            consumer.assign([KafkaTP(tp.topic, tp.partition, start) for tp, start in stops.start.items()])
            yield from self._drain(consumer, stops, chunk_records, chunk_bytes)
        finally:
            consumer.close()

    def _drain(self, consumer: Consumer, stops: Stops, chunk_records: int, chunk_bytes: int) -> Iterator[RawChunk]:
        reading = set(stops.end)
        pending: list[Message] = []
        pending_bytes = 0
        last_progress = time.monotonic()
        while True:
            chunk = None
            with stops.lock:  # a hand-off sees positions and ends between two steps, never during one
                # a partition is done when its position reaches the range's end: offsets are not
                # contiguous (transaction markers, aborted records, compaction)
                for tp in [tp for tp in reading if stops.position[tp] >= stops.end[tp]]:
                    reading.discard(tp)
                    consumer.incremental_unassign([KafkaTP(tp.topic, tp.partition)])
                if not reading:
                    break
                # consume() returns when it has num_messages or its timeout passed: asking for no more
                # than the ranges can still hold lets a small batch finish without waiting it out
                left = sum(stops.end[tp] - stops.position[tp] for tp in reading)
                messages = consumer.consume(num_messages=max(1, min(chunk_records, 100_000, left)), timeout=0.05)
                if self._oversized is not None:  # no retry can read past it: say where it is
                    raise self._too_large(_positions(consumer, reading, stops.position))
                if messages:
                    last_progress = time.monotonic()
                    if any(map(Message.error, messages)):  # events (partition EOF) and errors are rare
                        for message in messages:
                            error = message.error()
                            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                                self._raise(error, message)
                        messages = [m for m in messages if m.error() is None]
                    pending.extend(messages)
                    pending_bytes += sum(map(len, messages))  # len(): the value's size, counted in C
                elif time.monotonic() - last_progress > self.timeout_s:
                    stuck = ", ".join(f"{tp} (reading up to {stops.end[tp]})" for tp in sorted(reading))
                    raise self._failed(f"no progress from Kafka for {self.timeout_s:.0f}s while reading {stuck}")
                for position in consumer.position([KafkaTP(tp.topic, tp.partition) for tp in reading]):
                    if position.offset >= 0:
                        stops.position[TopicPartition(position.topic, position.partition)] = position.offset
                if len(pending) >= chunk_records or pending_bytes >= chunk_bytes:
                    chunk = _build(pending, stops.ends(), pending_bytes)
                    pending, pending_bytes = [], 0
            if chunk is not None:
                yield chunk
        if pending:
            yield _build(pending, stops.ends(), pending_bytes)

    def _too_large(self, positions: Mapping[TopicPartition, int]) -> IngestError:
        """The error of a read that met a response over ``receive.message.max.bytes``: which partition
        and offset hold the record batch, and how large it comes (each partition of several is tried
        alone at its position until one fails so)."""
        assert self._oversized is not None
        size, limit = self._oversized
        for tp, offset in sorted(positions.items()):
            if len(positions) > 1:
                found = self._probe(tp, offset)
                if found is None:
                    continue
                size, limit = found
            return RecordTooLarge(tp.topic, tp.partition, offset, size, limit)
        reading = ", ".join(f"{tp} from offset {offset}" for tp, offset in sorted(positions.items()))
        return ConfigError(
            f"kafka.receive.message.max.bytes: Kafka answered a fetch of {reading} with {size:,} bytes, over the "
            f"consumer's receive.message.max.bytes ({limit:,}). Raise it in `kafka:` to at least "
            f"{size + RESPONSE_OVERHEAD:,} (or leave it out) and run again. Nothing was committed."
        )

    def _probe(self, tp: TopicPartition, offset: int) -> tuple[int, int] | None:
        """(response size, limit) if a fetch of ``tp`` alone from ``offset`` is over the receive
        limit; None if its next records come, or nothing says so within ``timeout_s``."""
        self._oversized = None
        consumer = self._consumer(sized_for=1)
        try:
            consumer.assign([KafkaTP(tp.topic, tp.partition, offset)])
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                messages = consumer.consume(num_messages=1, timeout=0.1)
                if self._oversized is not None:
                    return self._oversized
                errors = [m.error() for m in messages]
                if any(e is None or e.code() == KafkaError._PARTITION_EOF for e in errors):
                    return None
        finally:
            consumer.close()
        return None

    @staticmethod
    def _raise(error: KafkaError, message: Message) -> None:
        where = f"{message.topic()}[{message.partition()}]" if message.topic() else "Kafka"
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            raise BrokerUnavailable(
                f"{where}: planned offsets were deleted by retention while the batch read them ({error.str()}). "
                "Nothing was committed; the next run plans again and applies `on_data_loss`."
            )
        if error.code() in TOPIC_REFUSALS:
            raise KafkaRefused(f"{where}: Kafka does not let this client read it: {error.str()}. " + REFUSED_HINT)
        raise BrokerUnavailable(f"{where}: Kafka error while reading: {error.str()}")

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        """Per partition, the first offset whose record timestamp is at or after ``timestamp_ms``
        (the end offset where there is none)."""
        consumer = self._consumer()
        try:
            found = consumer.offsets_for_times(
                [KafkaTP(tp.topic, tp.partition, timestamp_ms) for tp in tps], timeout=self.timeout_s
            )
        except KafkaException as error:
            raise self._failed(f"looking up offsets for timestamp {timestamp_ms} failed", error) from None
        finally:
            consumer.close()
        return {TopicPartition(str(t.topic), t.partition): t.offset for t in found}

    def commit_advisory(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Consumer-group offsets for lag dashboards. Never read back; failures are only logged.

        Sent through the admin client the source holds (an OffsetCommit outside any group
        generation, as a consumer with ``assign()`` sends it): about a millisecond once the
        group's coordinator is known, where a consumer made for it took 4-57 ms to start, commit
        and close. Kafka refuses it, as it refuses the consumer's, while the group has members."""
        if not offsets:
            return
        request = ConsumerGroupTopicPartitions(
            self._group_id, [KafkaTP(tp.topic, tp.partition, o) for tp, o in offsets.items()]
        )
        try:
            futures = self._admin.alter_consumer_group_offsets([request], request_timeout=self.timeout_s)
            for future in futures.values():
                refused = [tp for tp in future.result().topic_partitions if tp.error is not None]
                if refused:
                    raise KafkaException(", ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in refused))
        except KafkaException as error:
            log.warning("advisory offsets of consumer group %r not stored (ignored): %s", self._group_id, error)


def _positions(
    consumer: Consumer, tps: Collection[TopicPartition], known: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The consumer's position in each of ``tps`` (``known``'s where it has fetched nothing yet)."""
    found = consumer.position([KafkaTP(tp.topic, tp.partition) for tp in tps])
    at = {TopicPartition(p.topic, p.partition): p.offset for p in found}
    return {tp: at[tp] if at.get(tp, -1) >= 0 else known[tp] for tp in tps}


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


_SECOND = operator.itemgetter(1)
_NO_END = np.iinfo(np.int64).max


def _build(messages: list[Message], ends: Mapping[tuple[str, int], int], value_bytes: int) -> RawChunk:
    """Column-wise arrays of consumed messages, without those past their range's end;
    ``value_bytes``: the size of their values, as the reader counted them.

    A fetch returns whole record batches, so messages past ``end`` can arrive before the
    partition is unassigned; they belong to the next batch and are dropped here.
    """
    # one pass per field with map() into numpy: the per-message method calls are the reader's
    # main cost (the GIL is held throughout), so nothing else here works per message
    count = len(messages)
    names = sorted({topic for topic, _ in ends})
    limits = np.full((len(names), max(partition for _, partition in ends) + 1), _NO_END, np.int64)
    for (topic, partition), end in ends.items():
        limits[names.index(topic), partition] = end
    partitions = np.fromiter(map(Message.partition, messages), np.int32, count)
    offsets = np.fromiter(map(Message.offset, messages), np.int64, count)
    if len(names) == 1:
        topic_names = None
        past = offsets >= limits[0, partitions]
    else:
        code: dict[str | None, int] = {name: i for i, name in enumerate(names)}
        topic_names = list(map(Message.topic, messages))
        past = offsets >= limits[np.fromiter(map(code.__getitem__, topic_names), np.intp, count), partitions]
    if past.any():
        inside = np.flatnonzero(~past)
        messages = [messages[i] for i in inside]
        partitions, offsets = partitions[inside], offsets[inside]
        topic_names = None if topic_names is None else [topic_names[i] for i in inside]
        count = len(messages)
        value_bytes = sum(map(len, messages))  # len(): the value's size, counted in C
    if topic_names is None:
        topics = pa.repeat(pa.scalar(names[0], pa.string()), count)
    else:
        topics = pa.array(topic_names, type=pa.string())
    values: list[bytes | None] = list(map(Message.value, messages))
    keys = pa.array(list(map(Message.key, messages)), type=pa.binary())
    millis = np.fromiter(map(_SECOND, map(Message.timestamp, messages)), np.int64, count)  # -1: none
    timestamps = pa.array(millis * 1000, pa.int64(), mask=millis < 0).cast(pa.timestamp("us", tz="UTC"))
    nbytes = (pc.sum(pc.binary_length(keys)).as_py() or 0) + value_bytes

    def headers(i: int) -> Headers:
        raw = messages[i].headers()
        if not raw:
            return None
        pairs = raw.items() if isinstance(raw, dict) else raw
        return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]

    return RawChunk(
        topic=topics,
        partition=pa.array(partitions),
        offset=pa.array(offsets),
        timestamp=timestamps,
        key=keys,
        values=values,
        headers=headers,
        nbytes=nbytes,
    )
