"""The Spark engine in this process: same tables as the local engine, alternation, fencing, splitting."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from tests.integration.conftest import MakeEnv
from tests.runs import catch_up, one_batch
from tests.services.apicurio import Apicurio

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.conf import RuntimeConfig

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import Opened, open_pipeline
from ingest.config import BatchSpec, FieldSpec
from ingest.core.ledger_codec import decode_counts, find_ledger
from ingest.core.plan import Batch
from ingest.engines.spark import MAX_RECORDS_PER_PARTITION, MIN_PARTITIONS, SparkEngine
from ingest.errors import ConfigError, KeyInTwoTasks
from ingest.kafka.admin import produce
from ingest.ports import Produced
from ingest.progress import Advanced
from ingest.records import Declared
from tests.integration.test_changelog import changelog, debezium_stream, fold, send, table_rows
from tests.integration.test_registry_formats import V1, Avro, avro_env, v2
from tests.integration.test_route_by import RoutedByValue, route

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def spark_conf(spark: SparkSession) -> Iterator[RuntimeConfig]:
    """``spark.conf`` for one test: the ``spark.ingest.*`` keys it sets are unset afterwards."""
    yield spark.conf
    for key in (MIN_PARTITIONS, MAX_RECORDS_PER_PARTITION):
        spark.conf.unset(key)


def _sorted(table: pa.Table, *keys: str) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys])


def _partitions(pipeline: Opened) -> set[tuple[int, str]]:
    """(spec id, partition values) of every live data file of the rows table."""
    table = pipeline.rows.table.refresh()
    return {(task.file.spec_id, repr(task.file.partition)) for task in table.scan().plan_files()}


def _ledger_summary(pipeline: Opened) -> dict[str, object]:
    """What the head's ledger says of the batch: offsets, record times, counts, bytes, topic ids
    (not when each partition was read to its end, nor the marker's id and file names: each run's own)."""
    pipeline.rows.refresh()
    head = next(iter(pipeline.rows.ancestry()))
    name = pipeline.config.pipeline
    found = find_ledger(name, [head])
    assert found is not None
    ledger = found.ledger
    return {
        "ledger": replace(ledger, caught_up={}, sync=None),
        "dead letters owed": ledger.sync.count if ledger.sync is not None else None,
        "counts": decode_counts(name, head.summary),
        "format": head.summary.get(f"ingest.{name}.format"),
    }


# the SQL catalogs on a local disk, and a REST catalog on S3: the executors write to S3, the driver commits through REST
@pytest.mark.parametrize("catalog_kind", ["sqlite", "postgres", "rest+s3"], indirect=True)
def test_spark_writes_exactly_what_the_local_engine_writes(
    make_env: MakeEnv, spark: SparkSession, spark_conf: RuntimeConfig
) -> None:
    env = make_env(batch={"max_records": 2_000})
    env.produce(3_000, bad_every=11)
    spark_conf.set(MAX_RECORDS_PER_PARTITION, "333")  # sub-ranges with odd boundaries
    local = open_pipeline(env.config)
    on_spark = open_pipeline(env.config.model_copy(update={"table": f"{env.topic}.spark_orders"}))
    engine = SparkEngine.create(on_spark.config, on_spark.rows, spark)

    local_results = [one_batch(local), one_batch(local)]
    spark_results = [on_spark.run_batch(engine), on_spark.run_batch(engine)]

    assert [r.as_dict() | {"snapshot_id": 0, "seconds": 0} for r in spark_results] == [
        r.as_dict() | {"snapshot_id": 0, "seconds": 0} for r in local_results
    ]
    key = ("_kafka_partition", "_kafka_offset")
    assert _sorted(on_spark.rows.scan_columns(on_spark.rows.table.schema().column_names), *key).equals(
        _sorted(local.rows.scan_columns(local.rows.table.schema().column_names), *key)
    )
    local.dead.refresh()
    on_spark.dead.refresh()
    dead_columns = local.dead.table.schema().column_names
    assert _sorted(on_spark.dead.scan_columns(dead_columns), "partition", "offset").equals(
        _sorted(local.dead.scan_columns(dead_columns), "partition", "offset")
    )
    assert _partitions(on_spark) == _partitions(local)
    assert _ledger_summary(on_spark) == _ledger_summary(local)  # offsets, timestamps, counts, bytes
    env.verify()


def test_local_and_spark_batches_alternate_on_one_table(make_env: MakeEnv, spark: SparkSession) -> None:
    env = make_env(batch={"max_records": 700})
    env.produce(5_000, bad_every=13)
    on_spark = open_pipeline(env.config)
    engine = SparkEngine.create(on_spark.config, on_spark.rows, spark)

    statuses = []
    for i in range(4):
        if i % 2 == 0:
            statuses.append(on_spark.run_batch(engine).status)
        else:
            statuses.append(one_batch(open_pipeline(env.config)).status)  # another process, local engine
    env.produce(1_000, bad_every=13)
    results = list(on_spark.run(engine, until_caught_up=True, max_batches=None))

    assert statuses == ["committed"] * 4
    assert [r.batch for r in results] == list(range(5, 5 + len(results)))
    assert env.counts() == (6_000 - env.bad, env.bad)
    history = open_pipeline(env.config)
    env.verify()
    assert len(history.rows.table.metadata.snapshots) == 4 + len(results)


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_spark_routes_by_value_into_tables_it_creates_beside_the_local_engine(
    make_env: MakeEnv, spark: SparkSession
) -> None:
    env = make_env(partitions=3, batch={"max_records": 700})
    route(env, field="kind", allow=["click", "view"])
    by_value = RoutedByValue(env)
    by_value.produce(1_500, kinds=("click",), poison_every=41)
    on_spark = open_pipeline(env.config)
    engine = SparkEngine.create(on_spark.config, on_spark.target, spark)

    first = on_spark.run_batch(engine)  # creates the click table
    local = one_batch(open_pipeline(env.config))  # another process, local engine
    by_value.produce(1_500)  # view now: its table is created by a Spark batch
    rest = list(on_spark.run(engine, until_caught_up=True, max_batches=None))

    assert [first.status, local.status] == ["committed", "committed"]
    assert all(r.status == "committed" for r in rest)
    by_value.exact()


def test_a_fenced_spark_batch_is_planned_again(make_env: MakeEnv, spark: SparkSession) -> None:
    env = make_env(batch={"max_records": 1_000})
    env.produce(1_000, bad_every=9)
    slow = open_pipeline(env.config)
    fast = open_pipeline(env.config.model_copy(update={"batch": BatchSpec(max_records=1_200)}))

    class RacedSparkEngine(SparkEngine):
        raced = False

        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            if not RacedSparkEngine.raced:
                RacedSparkEngine.raced = True
                env.produce(400, bad_every=9)
                assert one_batch(fast).status == "committed"  # a local writer lands a larger batch 1 first
            return produced

    result = slow.run_batch(RacedSparkEngine(slow.config, slow.rows, spark))

    assert (result.batch, result.status) == (2, "committed")  # fenced, its files orphaned, planned again
    assert env.counts() == (1_400 - env.bad, env.bad)
    env.verify()


def test_sub_ranges_that_start_and_end_on_transaction_markers(
    make_env: MakeEnv, spark: SparkSession, spark_conf: RuntimeConfig
) -> None:
    """Offsets are not contiguous: every commit marker takes one. Tasks split at arbitrary offsets
    still read every record once, because a task ends when the consumer's position reaches its end."""
    from confluent_kafka import Producer

    env = make_env(partitions=1)
    producer = Producer({"bootstrap.servers": env.bootstrap, "transactional.id": f"{env.topic}-txn"})
    producer.init_transactions(30)
    for transaction in range(5):
        producer.begin_transaction()
        for i in range(10):
            n = transaction * 10 + i
            producer.produce(env.topic, value=b'{"order_id": %d}' % n, key=b"k%d" % n, partition=0)
        producer.commit_transaction(30)
    spark_conf.set(MAX_RECORDS_PER_PARTITION, "4")  # 55 offsets (5 markers) in 14 tasks
    pipeline = open_pipeline(env.config)
    engine = SparkEngine.create(pipeline.config, pipeline.rows, spark)

    planned = pipeline.plan()
    tasks = engine.tasks(planned)
    result = pipeline.run_batch(engine)

    assert planned.planned_records == 55 and len(tasks) == 14
    assert (result.records, result.dead_letters) == (50, 0)
    offsets = pipeline.rows.scan_columns(["_kafka_offset"])["_kafka_offset"].to_pylist()
    assert sorted(offsets) == [o for o in range(55) if o % 11 != 10]  # markers at 10, 21, 32, 43, 54
    env.verify()


def test_tasks_follow_the_spark_ingest_settings(
    make_env: MakeEnv, spark: SparkSession, spark_conf: RuntimeConfig
) -> None:
    env = make_env(partitions=2)
    env.produce(1_000)
    pipeline = open_pipeline(env.config)
    engine = SparkEngine.create(pipeline.config, pipeline.rows, spark)
    batch = pipeline.plan()

    default = engine.tasks(batch)
    spark_conf.set(MIN_PARTITIONS, "5")
    more = engine.tasks(batch)
    spark_conf.set(MAX_RECORDS_PER_PARTITION, "100")
    bounded = engine.tasks(batch)

    assert len(default) == 2  # one per partition: local[2] has a default parallelism of 2
    assert len(more) == 6  # each 500-offset partition in round(500 / 1000 * 5) = 3 pieces
    assert len(bounded) == 10 and max(t.size for t in bounded) == 100
    spark_conf.set(MIN_PARTITIONS, "zero")
    with pytest.raises(ConfigError, match=re.escape("spark.ingest.minPartitions='zero': expected a positive integer")):
        engine.tasks(batch)


def test_spark_executors_write_a_column_added_to_schema_with_the_batch_that_adds_it(
    make_env: MakeEnv, spark: SparkSession
) -> None:
    env = make_env(batch={"max_records": 1_000})
    env.produce(1_000)
    assert one_batch(open_pipeline(env.config)).status == "committed"
    declared = env.config.schema_
    assert declared is not None
    wider = env.config.model_copy(update={"schema_": [*declared, FieldSpec(name="channel", type="string")]})
    pipeline = open_pipeline(wider)
    before = pipeline.rows.table.metadata
    engine = SparkEngine.create(wider, pipeline.rows, spark)
    values = [json.dumps({"order_id": i, "channel": f"c{i % 3}"}).encode() for i in range(1_000, 2_000)]
    produce(env.bootstrap, env.topic, [(i % env.partitions, None, v, []) for i, v in enumerate(values)])

    result = pipeline.run_batch(engine)

    assert result.status == "committed"
    pipeline.rows.refresh()
    table = pipeline.rows.table
    assert len(table.metadata.snapshots) == len(before.snapshots) + 1
    head = table.current_snapshot()
    assert head is not None and head.schema_id == table.schema().schema_id != before.current_schema_id
    channel = table.schema().find_field("channel")
    assert channel.field_id == before.last_column_id + 1 and not channel.required
    # the executors' files carry the new column's id: Iceberg reads it by id, null in the older files
    channels = table.scan(selected_fields=("order_id", "channel")).to_arrow().sort_by("order_id")["channel"]
    assert channels.to_pylist() == [None] * 1_000 + [f"c{i % 3}" for i in range(1_000, 2_000)]
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_spark_executors_decode_avro_and_the_batch_evolves_for_a_writer_schema_they_meet(
    make_env: MakeEnv, registry: Apicurio, spark: SparkSession
) -> None:
    """Records of a writer schema the subject never had (registered under another subject) reach
    an executor: its task fails with SchemaAhead, rebuilt on the driver from the task's error, and
    the batch is produced again for the evolved table, committing once."""
    env = avro_env(make_env, registry, batch={"max_records": 5_000})
    Avro(env, registry).produce(600, V1)
    Avro(env, registry, subject=f"{env.topic}-other").produce(400, v2(), version=2)
    pipeline = open_pipeline(env.config)
    engine = SparkEngine.create(env.config, pipeline.rows, spark)

    result = pipeline.run_batch(engine)

    assert result.status == "committed" and result.records == 1_000
    pipeline.rows.refresh()
    table = pipeline.rows.table
    assert len(table.metadata.snapshots) == 1
    rows = table.scan(selected_fields=("order_id", "coupon")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(1_000))
    assert [r["coupon"] for r in rows] == [None] * 600 + [f"c{i}" for i in range(600, 1_000)]
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_spark_folds_a_changelog_as_the_local_engine_does(
    make_env: MakeEnv, spark: SparkSession, spark_conf: RuntimeConfig
) -> None:
    env = changelog(make_env, max_records=700)
    events = debezium_stream(3_000, 400, seed=13)
    send(env, events)
    spark_conf.set(MAX_RECORDS_PER_PARTITION, "50")  # not for a changelog: its partitions are folded whole
    local = open_pipeline(env.config)
    on_spark = open_pipeline(env.config.model_copy(update={"table": f"{env.topic}.spark_customers"}))
    engine = SparkEngine.create(on_spark.config, on_spark.rows, spark)

    tasks = engine.tasks(on_spark.plan())
    local_results = catch_up(local)
    spark_results = list(on_spark.run(engine, until_caught_up=True, max_batches=None))

    assert [(t.tp.partition, t.start) for t in tasks] == [(0, 0), (1, 0)]
    assert [r.as_dict() | {"snapshot_id": 0, "seconds": 0} for r in spark_results] == [
        r.as_dict() | {"snapshot_id": 0, "seconds": 0} for r in local_results
    ]
    assert len(spark_results) > 1  # later batches delete rows earlier ones wrote
    assert table_rows(env) == fold(events)
    columns = local.rows.table.schema().column_names
    assert _sorted(on_spark.rows.scan_columns(columns), "id").equals(_sorted(local.rows.scan_columns(columns), "id"))
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_key_changed_in_two_partitions_stops_a_spark_batch_and_the_local_engine_folds_it(
    make_env: MakeEnv, spark: SparkSession
) -> None:
    env = changelog(make_env)
    created = {"before": None, "after": {"id": 1, "email": "a@acme.com", "visits": 1}, "op": "c", "source": {}}
    updated = {**created, "before": created["after"], "after": {"id": 1, "email": "b@acme.com", "visits": 2}}
    produce(env.bootstrap, env.topic, [(p, b"1", json.dumps(e).encode(), []) for p, e in ((0, created), (1, updated))])
    pipeline = open_pipeline(env.config)

    with pytest.raises(KeyInTwoTasks, match=re.escape("key {'id': 1} of the changelog was changed in two partitions")):
        pipeline.run_batch(SparkEngine.create(pipeline.config, pipeline.rows, spark))
    assert pipeline.ledger() is None  # nothing committed
    assert one_batch(pipeline).status == "committed"

    assert table_rows(env) == {1: updated["after"]}  # the change in the higher partition wins
