"""The protocol's failure cases against the real broker and catalogs.

Retention loss is real: Apache Kafka deletes the unread records (DeleteRecords). What no broker
reports is injected at the adapter boundary, the Kafka adapter reporting what such a cluster
would: a topic recreated under the same topic id (a recreated topic gets a new id, refused by it
before its offsets are looked at), another cluster's id under the same topic, a partition gone
(Kafka never removes one), and a topic that had fewer partitions when the pipeline started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from ingest.assembly import Opened, open_pipeline
from ingest.config import BatchSpec
from ingest.core.plan import Batch, KafkaView, Watermarks
from ingest.engines.local import LocalEngine
from ingest.errors import CommitUnknown, DataLoss, Fenced, LedgerLost, TopicRecreated
from ingest.intents import SnapshotIntent
from ingest.ports import Produced
from ingest.progress import Advanced
from ingest.records import Declared
from tests.integration.conftest import MakeEnv, needs_apache_kafka, summary_of
from tests.runs import catch_up, head_ledger, one_batch

pytestmark = [pytest.mark.integration, pytest.mark.catalog_race]


#: what a test makes of the watermarks and cluster id Kafka reports
Change = Callable[[KafkaView], KafkaView]


def _view(pipeline: Opened, change: Change) -> KafkaView:
    real = type(pipeline.source).describe(pipeline.source)
    return change(real)


class _InjectedSource:
    """The real Kafka adapter, reporting watermarks/cluster id the way a real cluster would."""

    def __init__(self, pipeline: Opened, change: Change) -> None:
        self.pipeline, self.change = pipeline, change

    def __call__(self) -> KafkaView:
        return _view(self.pipeline, self.change)


def test_commit_with_lost_acknowledgement_lands_once(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(1_500, bad_every=100)
    pipeline = open_pipeline(env.config)
    for table in (pipeline.rows, pipeline.dead):
        real = table.commit
        calls: list[int] = []

        def applied_then_timeout(
            intent: SnapshotIntent, real: Callable[[SnapshotIntent], int] = real, calls: list[int] = calls
        ) -> int:
            snapshot_id = real(intent)
            calls.append(snapshot_id)
            if len(calls) == 1:
                raise CommitUnknown("simulated timeout after the catalog applied the commit")
            return snapshot_id

        table.commit = applied_then_timeout  # type: ignore[method-assign, assignment]

    result = one_batch(pipeline)

    assert result.status == "landed"
    assert result.retries == {"conflict": 0, "unknown": 2, "fenced": 0}  # each table's commit observed again once
    env.exact()
    pipeline.rows.refresh()
    assert len(pipeline.rows.table.metadata.snapshots) == 1


def test_foreign_commit_between_plan_and_commit(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(1_000)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    env.produce(1_000)
    other = open_pipeline(env.config)

    class ForeignWriterMidBatch(LocalEngine):
        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            table = other.rows.table.refresh()
            foreign = pa.Table.from_pylist(
                [
                    {
                        "_kafka_topic": "elsewhere",
                        "_kafka_partition": 0,
                        "_kafka_offset": 0,
                        "order_id": -1,
                        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
                    }
                ],
                schema=table.schema().as_arrow(),
            )
            table.append(foreign)  # another writer's snapshot, without this pipeline's ledger
            return produced

    result = pipeline.run_batch(ForeignWriterMidBatch(pipeline.config, pipeline.rows))

    assert result.status == "committed" and result.batch == 2
    pipeline.rows.refresh()
    summaries = [summary_of(s) for s in pipeline.rows.table.metadata.snapshots]
    assert ["ingest.orders.offsets" in s for s in summaries] == [True, False, True]
    env.exact(foreign_rows=1)


def test_concurrent_writer_fences_the_slower_batch(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(3_000, bad_every=7)
    slow = open_pipeline(env.config)
    fast = open_pipeline(env.config)

    class RacedEngine(LocalEngine):
        raced = False

        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            if not RacedEngine.raced:
                RacedEngine.raced = True
                assert one_batch(fast).status == "committed"  # same offsets, commits first
            return produced

    result = slow.run_batch(RacedEngine(slow.config, slow.rows))

    # the slow copy's batch 1 had identical offsets to the fast one: recognised as landed
    assert (result.batch, result.status) == (1, "landed")
    env.produce(500)
    assert one_batch(slow).batch == 2
    for _ in catch_up(slow):
        pass
    env.exact()


def test_writer_with_a_different_range_is_fenced_and_replans(make_env: MakeEnv) -> None:
    env = make_env(batch={"max_records": 1_000})
    env.produce(1_000, bad_every=9)
    slow = open_pipeline(env.config)
    fast = open_pipeline(env.config.model_copy(update={"batch": BatchSpec(max_records=1_200)}))

    class RacedEngine(LocalEngine):
        raced = False

        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            if not RacedEngine.raced:
                RacedEngine.raced = True
                env.produce(400, bad_every=9)
                assert one_batch(fast).status == "committed"  # a larger batch 1 lands first
                assert sum(head_ledger(fast).ledger.offsets.values()) == 1_200
            return produced

    result = slow.run_batch(RacedEngine(slow.config, slow.rows))

    assert (result.batch, result.status) == (2, "committed")  # fenced, then planned again
    retries = result.as_dict()["commit_retries"]
    assert result.retries["fenced"] == 1 and isinstance(retries, dict) and retries["fenced"] == 1
    env.exact()


def test_fenced_too_often_is_a_retryable_error(make_env: MakeEnv) -> None:
    env = make_env(commit={"max_replans": 0})
    env.produce(500)
    slow = open_pipeline(env.config)
    fast = open_pipeline(env.config)

    class AlwaysRaced(LocalEngine):
        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            env.produce(10)
            one_batch(fast)
            return produced

    with pytest.raises(Fenced) as caught:
        slow.run_batch(AlwaysRaced(slow.config, slow.rows))
    assert caught.value.retryable and "run again" in str(caught.value)
    env.verify()


@needs_apache_kafka
def test_retention_loss_fails_closed_by_default(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(200)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    env.produce(200)
    committed = head_ledger(pipeline).ledger.offsets
    tp = sorted(committed)[0]
    env.delete_records({tp.partition: committed[tp] + 30})  # retention ran over 30 unread records

    with pytest.raises(DataLoss) as caught:
        one_batch(pipeline)
    assert f"[{committed[tp]}, {committed[tp] + 30})" in str(caught.value)
    assert "on_data_loss: skip" in str(caught.value)
    assert head_ledger(pipeline).ledger.batch == 1


@needs_apache_kafka
def test_retention_loss_with_skip_records_the_lost_range(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, on_data_loss="skip")
    env.produce(200)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    env.produce(200)
    committed = head_ledger(pipeline).ledger.offsets
    tp = sorted(committed)[0]
    env.delete_records({tp.partition: committed[tp] + 30})  # retention ran over 30 unread records

    result = one_batch(pipeline)

    assert result.status == "committed"
    lost = head_ledger(pipeline).ledger.lost
    assert [(r.tp, r.start, r.end) for r in lost] == [(tp, committed[tp], committed[tp] + 30)]
    # the lost range is in neither table, everything else is there exactly once
    env.exact(lost={tp.partition: (committed[tp], committed[tp] + 30)})


@pytest.mark.parametrize("how", ["offsets-reset", "cluster-id", "partition-gone"])
def test_recreated_topic_or_cluster_fails(make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    env = make_env(partitions=2)
    env.produce(100)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)

    def recreated(view: KafkaView) -> KafkaView:
        parts = dict(view.partitions)
        if how == "offsets-reset":
            parts = {tp: Watermarks(0, 3) for tp in parts}
        elif how == "partition-gone":
            parts.pop(max(parts))
        else:
            return dataclasses.replace(view, cluster_id="another-cluster")
        return dataclasses.replace(view, partitions=parts)

    monkeypatch.setattr(pipeline.source, "describe", _InjectedSource(pipeline, recreated))
    with pytest.raises(TopicRecreated):
        one_batch(pipeline)


def test_ledger_lost_after_expiry_fails_closed(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(100)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    table = pipeline.rows.table.refresh()
    table.append(pa.Table.from_pylist([], schema=table.schema().as_arrow()))  # foreign, no ledger
    table = table.refresh()
    table.maintenance.expire_snapshots().older_than(datetime.now(tz=UTC)).commit()

    with pytest.raises(LedgerLost) as caught:
        one_batch(pipeline)
    assert "ingest.pipelines" in str(caught.value)


def test_new_partitions_start_at_earliest(make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(partitions=4)
    env.produce(400)
    pipeline = open_pipeline(env.config)
    hidden = sorted(type(pipeline.source).describe(pipeline.source).partitions)[-1]

    def fewer(view: KafkaView) -> KafkaView:  # the topic had 3 partitions at first
        return dataclasses.replace(view, partitions={k: v for k, v in view.partitions.items() if k != hidden})

    monkeypatch.setattr(pipeline.source, "describe", _InjectedSource(pipeline, fewer))
    one_batch(pipeline)
    assert hidden not in head_ledger(pipeline).ledger.offsets
    monkeypatch.undo()
    result = one_batch(pipeline)  # partition added: read from its earliest offset
    assert result.records == 100
    env.exact()
