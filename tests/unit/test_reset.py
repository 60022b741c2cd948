"""``ingest reset`` (ingest.ops.reset.move_ledger) of a recreated topic, over the memory table: nothing running."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from ingest.committer import observe
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition
from ingest.core.ledger_codec import encode, register
from ingest.core.plan import KafkaView, PlanPolicy, Watermarks, plan_batch
from ingest.errors import ConfigError, TopicIdChanged
from ingest.intents import Append
from ingest.ops.reset import move_ledger
from ingest.ops.reset_command import ResetCommand, ResetTarget
from ingest.testing.memory_table import MemoryCatalog, MemoryTable

PIPELINE = "orders"
O0, O1, O2 = (TopicPartition("orders", p) for p in range(3))
Q0 = TopicPartition("payments", 0)
OLD_ID, NEW_ID, PAYMENTS_ID = "GCRqv5ExRvmLGBc9uuOoNQ", "uNtjX0cYT6K1pW3v_9Bfsw", "Zm9vYmFyYmF6cXV4MTIzNA"


class Kafka:
    """What a reset asks of Kafka: a recreated ``orders`` (ids and watermarks as given) and ``payments``."""

    def __init__(self, partitions: Mapping[TopicPartition, Watermarks], topic_ids: Mapping[str, str]) -> None:
        self.view = KafkaView("cluster", dict(partitions), dict(topic_ids))

    def describe(self) -> KafkaView:
        return self.view

    def offsets_for_time(self, tps: object, timestamp_ms: int) -> dict[TopicPartition, int]:
        raise AssertionError("not asked here")


def table_with(ledger: Ledger) -> MemoryTable:
    table = MemoryCatalog("lake.orders").table()
    table.commit(Append([], encode(PIPELINE, ledger, BatchCounts()), register({}, PIPELINE)))
    return table


def reset(table: MemoryTable, kafka: Kafka, target: ResetTarget) -> Ledger:
    move_ledger(table, kafka, ResetCommand(PIPELINE, target, "recreated", "reset-1", "operator", 3))
    found = observe(table, PIPELINE)
    assert found is not None
    return found.ledger


OLD = Ledger(
    batch=4,
    offsets={O0: 150, O1: 150, O2: 150, Q0: 7},
    timestamps={O0: 1_000, O1: 2_000, O2: 3_000, Q0: 4_000},
    caught_up={O1: 5_000, O2: 5_000, Q0: 5_000},
    topic_ids={"orders": OLD_ID, "payments": PAYMENTS_ID},
)
RECREATED = Kafka(
    {O0: Watermarks(0, 225), O1: Watermarks(0, 225), O2: Watermarks(0, 225), Q0: Watermarks(0, 9)},
    {"orders": NEW_ID, "payments": PAYMENTS_ID},
)


def test_a_reset_naming_the_recreated_topic_records_its_new_id_and_the_next_batch_reads_it_whole() -> None:
    table = table_with(OLD)
    with pytest.raises(TopicIdChanged):
        plan_batch(OLD, RECREATED.view, PlanPolicy())

    after = reset(table, RECREATED, ResetTarget("offsets", {O0: 0, O1: 0, O2: 0}))

    assert after.topic_ids == {"orders": NEW_ID, "payments": PAYMENTS_ID}
    assert after.offsets == {O0: 0, O1: 0, O2: 0, Q0: 7}
    assert after.timestamps == {Q0: 4_000}  # those of orders were the deleted topic's records'
    assert after.caught_up == {Q0: 5_000}  # as was reading orders to its end
    batch = plan_batch(after, RECREATED.view, PlanPolicy())
    assert batch.ranges() == [(O0, 0, 225), (O1, 0, 225), (O2, 0, 225), (Q0, 7, 9)]


def test_a_reset_naming_some_partitions_of_a_recreated_topic_is_refused_and_changes_nothing() -> None:
    table = table_with(OLD)

    with pytest.raises(ConfigError, match=r"must name every partition of them; missing: orders\[1\], orders\[2\]"):
        reset(table, RECREATED, ResetTarget("offsets", {O0: 0}))

    found = observe(table, PIPELINE)
    assert found is not None and found.ledger == OLD


def test_a_topic_recreated_with_fewer_partitions_loses_the_ones_it_no_longer_has() -> None:
    fewer = Kafka({O0: Watermarks(0, 5), Q0: Watermarks(0, 9)}, {"orders": NEW_ID, "payments": PAYMENTS_ID})

    after = reset(table_with(OLD), fewer, ResetTarget("offsets", {O0: 0}))

    assert after.offsets == {O0: 0, Q0: 7}
    assert after.timestamps == {Q0: 4_000}  # orders[2] would hold valid-through back for good
    assert plan_batch(after, fewer.view, PlanPolicy()).ranges() == [(O0, 0, 5), (Q0, 7, 9)]


def test_a_reset_of_another_topic_keeps_the_recreated_ones_old_id_so_runs_still_refuse_it() -> None:
    after = reset(table_with(OLD), RECREATED, ResetTarget("offsets", {Q0: 9}))

    assert after.topic_ids == {"orders": OLD_ID, "payments": PAYMENTS_ID}
    assert after.timestamps == OLD.timestamps and after.caught_up == OLD.caught_up
    with pytest.raises(TopicIdChanged, match="'orders'"):
        plan_batch(after, RECREATED.view, PlanPolicy())


def test_a_reset_to_earliest_records_every_topics_id() -> None:
    after = reset(table_with(OLD), RECREATED, ResetTarget("earliest"))

    assert after.topic_ids == {"orders": NEW_ID, "payments": PAYMENTS_ID}
    assert after.offsets == {O0: 0, O1: 0, O2: 0, Q0: 0}
