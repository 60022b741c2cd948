"""Creating topics and producing records: what the demo, the notebook and the tests feed Kafka with."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from ingest.errors import BrokerUnavailable
from ingest.kafka.clients import LIBRDKAFKA_LOG

#: a record's headers as sent: each key with its value, or None for a header without one
SentHeaders = Sequence[tuple[str, bytes | None]] | None


def ping(bootstrap_servers: str, timeout_s: float = 1.0) -> bool:
    """Whether a broker answers a metadata request."""
    try:
        _admin(bootstrap_servers).list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


def _admin(bootstrap_servers: str) -> AdminClient:
    """An admin client whose log lines go where the other clients' go (not raw to stderr)."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOG}
    return AdminClient(conf)


#: how long producing waits for the broker to acknowledge what it sent
FLUSH_TIMEOUT_S = 120.0


def create_topic(bootstrap_servers: str, topic: str, partitions: int, timeout_s: float = 10.0) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = _admin(bootstrap_servers)
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout_s)
    for future in futures.values():
        try:
            future.result(timeout_s + 30)
        except concurrent.futures.TimeoutError:
            raise BrokerUnavailable(f"creating topic {topic!r} on {bootstrap_servers} got no answer") from None
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerUnavailable(f"cannot create topic {topic!r}: {error}") from None


def produce(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[tuple[int, bytes | None, bytes | None, SentHeaders]],
) -> int:
    """Send ``(partition, key, value, headers)`` records (idempotent, lz4); returns the count.

    The last record of each partition goes in a request of its own, so brokers that report the
    end offset of a partition from its last record batch report it right.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            # its log lines (a queue purged at close, say) go where the other clients' go, not raw to stderr
            "logger": LIBRDKAFKA_LOG,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
        }
    )
    last: dict[int, tuple[bytes | None, bytes | None, SentHeaders]] = {}
    count = 0
    for partition, key, value, headers in records:
        if partition in last:
            _send(producer, topic, partition, *last[partition])
            count += 1
        last[partition] = (key, value, headers)
    _flush(producer, bootstrap_servers)
    for partition, (key, value, headers) in sorted(last.items()):
        _send(producer, topic, partition, key, value, headers)
        _flush(producer, bootstrap_servers)
        count += 1
    return count


def _flush(producer: Producer, bootstrap_servers: str) -> None:
    unsent = producer.flush(FLUSH_TIMEOUT_S)
    if unsent:
        raise BrokerUnavailable(
            f"{unsent} records were not acknowledged by {bootstrap_servers} within {FLUSH_TIMEOUT_S:.0f}s"
        )


def _send(
    producer: Producer,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    headers: SentHeaders,
) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers)  # type: ignore[arg-type]
            return
        except BufferError:
            producer.poll(0.1)
