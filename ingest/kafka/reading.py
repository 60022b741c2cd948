"""Reading exact offset ranges ``[start, end)`` of Kafka partitions, in raw chunks.

A read ``assign()``s each partition at its range's start (no group subscription, no auto-commit,
``auto.offset.reset=error``, ``read_committed``). Offsets are not contiguous (transaction markers,
aborted records, compaction), so a partition is done when the consumer's position reaches the
range's end, never when a count of records is reached. :class:`Stops` holds where a read has got to
and where each range ends, so that another thread may hand the rest of a range to another reader
while it runs. What stops a read becomes the error the command exits with: no progress, offsets
deleted by retention, a topic the client may not read, or a record batch larger than the consumer
accepts (its partition and offset found and named).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence

from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka import TopicPartition as KafkaTP

from ingest.core.ledger import TopicPartition
from ingest.core.ranges import Range
from ingest.errors import BrokerUnavailable, ConfigError, IngestError, KafkaRefused, RecordTooLarge
from ingest.kafka.chunks import build_chunk
from ingest.kafka.clients import REFUSED_HINT, TOPIC_REFUSALS, Clients
from ingest.kafka.settings import RESPONSE_OVERHEAD
from ingest.records import RawChunk

#: records and value bytes read from Kafka at a time. Raw records cost several hundred bytes of
#: Python objects each; small chunks keep that in the CPU caches and let reading overlap with
#: decoding at a fine grain: faster and smaller than 200k-record chunks (docs/performance.md).
#: Files are sized apart from them (``batch.chunk_records`` rows written together).
READ_CHUNK_RECORDS = 25_000
READ_CHUNK_BYTES = 8 << 20


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


def read_ranges(
    clients: Clients,
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
    clients.oversized = None  # what an earlier request met is not this read's
    consumer = clients.consumer(sized_for=max(end - stops.start[tp] for tp, end in stops.end.items()))
    try:
        consumer.assign([KafkaTP(tp.topic, tp.partition, start) for tp, start in stops.start.items()])
        yield from _drain(clients, consumer, stops, chunk_records, chunk_bytes)
    finally:
        consumer.close()


def _drain(
    clients: Clients, consumer: Consumer, stops: Stops, chunk_records: int, chunk_bytes: int
) -> Iterator[RawChunk]:
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
            if clients.oversized is not None:  # no retry can read past it: say where it is
                raise _too_large(clients, _positions(consumer, reading, stops.position))
            if messages:
                last_progress = time.monotonic()
                if any(map(Message.error, messages)):  # events (partition EOF) and errors are rare
                    for message in messages:
                        error = message.error()
                        if error is not None and error.code() != KafkaError._PARTITION_EOF:
                            _raise(error, message)
                    messages = [m for m in messages if m.error() is None]
                pending.extend(messages)
                pending_bytes += sum(map(len, messages))  # len(): the value's size, counted in C
            elif time.monotonic() - last_progress > clients.timeout_s:
                stuck = ", ".join(f"{tp} (reading up to {stops.end[tp]})" for tp in sorted(reading))
                raise clients.failed(f"no progress from Kafka for {clients.timeout_s:.0f}s while reading {stuck}")
            for position in consumer.position([KafkaTP(tp.topic, tp.partition) for tp in reading]):
                if position.offset >= 0:
                    stops.position[TopicPartition(position.topic, position.partition)] = position.offset
            if len(pending) >= chunk_records or pending_bytes >= chunk_bytes:
                chunk = build_chunk(pending, stops.ends(), pending_bytes)
                pending, pending_bytes = [], 0
        if chunk is not None:
            yield chunk
    if pending:
        yield build_chunk(pending, stops.ends(), pending_bytes)


def _too_large(clients: Clients, positions: Mapping[TopicPartition, int]) -> IngestError:
    """The error of a read that met a response over ``receive.message.max.bytes``: which partition
    and offset hold the record batch, and how large it comes (each partition of several is tried
    alone at its position until one fails so)."""
    assert clients.oversized is not None
    size, limit = clients.oversized
    for tp, offset in sorted(positions.items()):
        if len(positions) > 1:
            found = _probe(clients, tp, offset)
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


def _probe(clients: Clients, tp: TopicPartition, offset: int) -> tuple[int, int] | None:
    """(response size, limit) if a fetch of ``tp`` alone from ``offset`` is over the receive
    limit; None if its next records come, or nothing says so within the clients' ``timeout_s``."""
    clients.oversized = None
    consumer = clients.consumer(sized_for=1)
    try:
        consumer.assign([KafkaTP(tp.topic, tp.partition, offset)])
        deadline = time.monotonic() + clients.timeout_s
        while time.monotonic() < deadline:
            messages = consumer.consume(num_messages=1, timeout=0.1)
            if clients.oversized is not None:
                return clients.oversized
            errors = [m.error() for m in messages]
            if any(e is None or e.code() == KafkaError._PARTITION_EOF for e in errors):
                return None
    finally:
        consumer.close()
    return None


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


def _positions(
    consumer: Consumer, tps: Collection[TopicPartition], known: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The consumer's position in each of ``tps`` (``known``'s where it has fetched nothing yet)."""
    found = consumer.position([KafkaTP(tp.topic, tp.partition) for tp in tps])
    at = {TopicPartition(p.topic, p.partition): p.offset for p in found}
    return {tp: at[tp] if at.get(tp, -1) >= 0 else known[tp] for tp in tps}
