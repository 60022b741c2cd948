"""A consumer group's advisory offsets: how far the ledger reached, for lag dashboards.

Never read back (the ledger in the table is the truth), so nothing may wait on them. Each batch's
offsets go out as an OffsetCommit through the source's admin client (outside any group
generation, as a consumer with ``assign()`` sends it) and the batch moves on without its answer. A
group coordinator that is down or moving answers only after the request times out
(``batch.read_timeout_s``): at most one request is in flight, and the offsets given meanwhile wait,
the newest only, until it has answered. The end of a run waits a few seconds for what is still
unsent, so a dashboard shows the run's last batch; a failure is only logged.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from ingest.core.ledger import TopicPartition

log = logging.getLogger("ingest.kafka.source")

#: how long the end of a run waits for its last advisory offsets (a coordinator that is up
#: answers in about a millisecond)
FLUSH_WAIT_S = 5.0


class AdvisoryOffsets:
    """The advisory offsets of ``group_id``, sent through ``admin`` without waiting for them."""

    def __init__(self, admin: AdminClient, group_id: str, timeout_s: float) -> None:
        self.admin = admin
        self.group_id = group_id
        self.timeout_s = timeout_s
        #: the request Kafka has not answered yet, if any
        self._in_flight: list[Future[Any]] = []
        #: the newest offsets given while a request was in flight
        self._next: dict[TopicPartition, int] | None = None

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Send ``offsets`` now, or once the request in flight has answered."""
        if offsets:
            self._next = dict(offsets)
            self._send()

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Wait up to ``wait_s`` for the request in flight and for the offsets still unsent."""
        deadline = time.monotonic() + wait_s
        while self._in_flight or self._next is not None:
            _, waiting = concurrent.futures.wait(self._in_flight, timeout=max(0.0, deadline - time.monotonic()))
            if waiting:
                log.warning(
                    "advisory offsets of consumer group %r not stored (ignored): its coordinator did not answer "
                    "within %.0fs",
                    self.group_id,
                    wait_s,
                )
                return
            self._send()

    def _send(self) -> None:
        if any(not future.done() for future in self._in_flight):
            return
        for future in self._in_flight:
            self._report(future)
        self._in_flight = []
        if self._next is None:
            return
        offsets, self._next = self._next, None
        request = ConsumerGroupTopicPartitions(
            self.group_id, [KafkaTP(tp.topic, tp.partition, offset) for tp, offset in offsets.items()]
        )
        try:
            sent = self.admin.alter_consumer_group_offsets([request], request_timeout=self.timeout_s)
        except KafkaException as error:
            self._failed(error)
            return
        self._in_flight = list(sent.values())

    def _report(self, future: Future[Any]) -> None:
        """Log what an answered request says went wrong, if anything."""
        try:
            refused = [tp for tp in future.result().topic_partitions if tp.error is not None]
        except KafkaException as error:
            self._failed(error)
            return
        if refused:
            self._failed(", ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in refused))

    def _failed(self, why: object) -> None:
        log.warning("advisory offsets of consumer group %r not stored (ignored): %s", self.group_id, why)
