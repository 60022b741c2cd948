"""The example DAG run by real Airflow 3 against the broker and a SQLite catalog: what lands, what fails how."""

from __future__ import annotations

import re
import signal
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from ingest.kafka.embedded import free_port
from tests.integration.conftest import Env, MakeEnv, Routed, gone, record, workers_of
from tests.integration.test_changelog import changelog, debezium_stream, fold, send, table_rows

from .conftest import NEEDS_AIRFLOW, Airflow, dag_id, quick_retries

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)


def _rewrite(env: Env, **changes: object) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    data.update(changes)
    env.config_path.write_text(yaml.safe_dump(data))


#: batches large enough to be shared with a worker process (see ingest.engines.local)
SHARED = {"max_records": 1_000, "chunk_records": 250, "workers": 2}


@pytest.mark.parametrize("catalog_kind", ["sqlite", "rest+s3"])  # and once on a REST catalog with S3
def test_dag_run_ingests_exactly_the_produced_records(make_env: MakeEnv, airflow: Airflow) -> None:
    env = make_env(batch=SHARED)
    env.produce(3_000, bad_every=11)
    dag = airflow.dag(env)

    first = airflow.test(dag)

    assert first.state == "success", first.tasks
    assert first.state_of("ingest") == first.state_of("freshness") == "success"
    assert env.counts() == (3_000 - env.bad, env.bad)
    totals = airflow.xcom(dag.dag_id, first.run_id, "ingest")
    assert (totals["records"], totals["dead_letters"], totals["committed"]) == (3_000 - env.bad, env.bad, 3)
    env.verify()

    # the table's asset: an event per run that landed rows, through the DAG's alias
    config = yaml.safe_load(env.config_path.read_text())
    table = f"iceberg://{config['catalog']['name']}/{config['table'].replace('.', '/')}"
    (event,) = airflow.asset_events(table)
    assert (event["records"], event["snapshot_id"]) == (3_000 - env.bad, totals["snapshot_id"])
    bad_before = env.bad

    env.produce(700, bad_every=11)  # the next five-minute run picks up what arrived since
    second = airflow.test(dag)
    assert second.state == "success", second.tasks
    assert env.counts() == (3_700 - env.bad, env.bad)
    env.verify()
    assert airflow.test(dag).state == "success"  # nothing new: no event
    later = 700 - (env.bad - bad_before)
    assert [e["records"] for e in airflow.asset_events(table)] == [3_000 - bad_before, later]


def test_a_dag_run_lands_a_changelog_as_the_fold_of_its_changes(make_env: MakeEnv, airflow: Airflow) -> None:
    env = changelog(make_env, max_records=700)
    events = debezium_stream(3_000, 300, seed=23)
    send(env, events[:2_000])
    dag = airflow.dag(env)

    first = airflow.test(dag)

    assert first.state == "success", first.tasks
    assert table_rows(env) == fold(events[:2_000])
    send(env, events[2_000:])  # the next run's changes update and delete rows the first landed
    second = airflow.test(dag)
    assert second.state == "success", second.tasks
    assert table_rows(env) == fold(events)
    env.verify()


def test_a_dag_of_a_config_of_two_tables_ingests_both(routed: Routed, airflow: Airflow) -> None:
    routed.produce("a1", 1_200, bad_every=11)
    routed.produce("a2", 600, bad_every=13)
    routed.produce("b", 900, bad_every=7)
    dag = airflow.dag(replace(routed.env, config_path=routed.path))

    run = airflow.test(dag)

    assert run.state == "success", run.tasks
    assert run.state_of("ingest") == run.state_of("freshness") == "success"
    routed.exact()
    totals = airflow.xcom(dag.dag_id, run.run_id, "ingest")
    refunds = routed.tables[1]
    assert totals["records"] == sum(routed.produced[t] - routed.bad[t] for t in routed.tables)
    assert totals["tables"][refunds]["dead_letters"] == routed.bad[refunds]
    catalog = yaml.safe_load(routed.path.read_text())["catalog"]["name"]
    for table in routed.tables:  # an event of each table's asset
        (event,) = airflow.asset_events(f"iceberg://{catalog}/{table.replace('.', '/')}")
        assert event["records"] == routed.produced[table] - routed.bad[table]


@pytest.mark.parametrize("point", ["mid-write", "between-commits"])
def test_killed_task_is_retried_without_duplicates(make_env: MakeEnv, airflow: Airflow, point: str) -> None:
    """The process running the ingest task dies mid-batch (SIGKILL: no cleanup) and takes its worker
    process with it; the next try runs the batch again."""
    env = make_env(batch=SHARED)
    env.produce(3_000, bad_every=11)

    # `airflow dags test` runs the task in its own process; the failpoint SIGKILLs that process in batch 1
    killed = airflow.cli("dags", "test", dag_id(env), env={"INGEST_FAILPOINT": point})
    output, _ = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, output[-3000:]
    assert f"running task <TaskInstance: {dag_id(env)}.ingest" in output
    assert "records in this process, 1 workers joining as they are ready" in output, output[-3000:]
    assert gone(killed.pid), f"the killed task's workers still run: {workers_of(killed.pid)}"
    rows, dead = env.counts()
    assert dead == 0  # batch 1's dead letters follow its rows commit: not yet
    assert (rows > 0) is (point == "between-commits")  # its rows landed at between-commits, not mid-write

    retried = airflow.test(airflow.dag(env))

    assert retried.state == "success", retried.tasks
    assert env.counts() == (3_000 - env.bad, env.bad)
    env.verify()


def test_overlapping_runs_never_duplicate(make_env: MakeEnv, airflow: Airflow) -> None:
    """Two DAG runs' ingest tasks at once (max_active_runs > 1, or a retry racing a slow run), in two workers."""
    env = make_env(batch={"max_records": 250})
    env.produce(500)
    dag = airflow.dag(env)
    assert airflow.test(dag).state == "success"  # the pipeline has been running
    env.produce(4_000, bad_every=13)
    # two more DAG runs, as the scheduler would create them (their tasks marked done without running)
    run_ids = [
        airflow.test(dag, logical_date=datetime(2026, 12, day, tzinfo=UTC), mark_success_pattern=".*").run_id
        for day in (1, 2)
    ]

    workers = [airflow.cli("tasks", "test", dag_id(env), "ingest", run_id) for run_id in run_ids]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]

    for run_id, output in zip(run_ids, outputs, strict=True):
        # the task succeeded, or failed with an error Airflow retries; never one that is not retried
        assert airflow.xcom(dag_id(env), run_id, "ingest") or "retryable" in output, output[-3000:]
        assert "not retried" not in output, output[-3000:]
        # it wrote batches ("landed": the other had committed the same batch first) or was fenced: they overlapped
        assert re.search(r"batch \d+: (committed|landed),|was fenced", output), output[-3000:]
    assert airflow.test(dag).state == "success"  # the next run catches up whatever a fenced one left
    assert env.counts() == (4_500 - env.bad, env.bad)
    env.verify()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"topic": "typo"}, "topic: unknown key"),  # bad config
        ({"topics": ["no-such-topic-here"]}, "does not exist"),  # TopicNotFound
    ],
)
def test_fatal_error_fails_without_retry(
    make_env: MakeEnv, airflow: Airflow, capfd: pytest.CaptureFixture[str], change: dict[str, object], message: str
) -> None:
    env = make_env()
    env.produce(100)
    _rewrite(env, **change)

    outcome = airflow.test(quick_retries(airflow.dag(env)))

    assert outcome.state_of("ingest") == "failed"
    assert outcome.tries_of("ingest") == 1  # although a retry was allowed
    assert message in capfd.readouterr().out  # the reason, in the task log


def test_retryable_error_is_retried(make_env: MakeEnv, airflow: Airflow, capfd: pytest.CaptureFixture[str]) -> None:
    env = make_env()
    catalog = yaml.safe_load(env.config_path.read_text())["catalog"]
    _rewrite(env, catalog={**catalog, "uri": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"})

    outcome = airflow.test(quick_retries(airflow.dag(env)))

    assert outcome.state_of("ingest") == "failed"
    assert outcome.tries_of("ingest") == 2  # the retry ran (and failed the same way)
    out = capfd.readouterr().out
    assert "retryable CatalogUnavailable" in out and "cannot open Iceberg catalog" in out


def _produce_with_timestamp(env: Env, count: int, when: datetime, partition: int | None = None) -> None:
    """``count`` records stamped ``when``, spread over the partitions or all to ``partition``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": env.bootstrap})
    for i in range(env.produced, env.produced + count):
        spread, key, value, headers = record(i, env.partitions, None)
        ts = int(when.timestamp() * 1000)
        to = spread if partition is None else partition
        producer.produce(env.topic, value=value, key=key, partition=to, headers=list(headers), timestamp=ts)
        producer.flush()  # one record per request: the broker's end offsets are only right that way
    env.produced += count


def test_freshness_fails_on_a_stalled_pipeline(
    make_env: MakeEnv, airflow: Airflow, capfd: pytest.CaptureFixture[str]
) -> None:
    """The pipeline stopped two hours ago with records left to read (its ingest task has not run
    since): the committed data is complete only through then, and freshness fails."""
    env = make_env(batch={"max_records": 8, "read_timeout_s": 20})
    stalled_at = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    _produce_with_timestamp(env, 16, stalled_at)
    assert env.cli("run", "--max-batches", "1").returncode == 0  # 8 of 16: every partition behind

    outcome = airflow.test(quick_retries(airflow.dag(env)), mark_success_pattern="ingest")

    assert env.counts() == (8, 0)
    assert outcome.state_of("freshness") == "failed"
    assert outcome.tries_of("freshness") == 1  # not retried: the next run checks again
    out = capfd.readouterr().out
    assert f"complete through {stalled_at.isoformat(timespec='seconds')}" in out
    assert "older than the bound of 0:30:00" in out and "the pipeline is stalled" in out


def test_a_partition_without_new_records_does_not_make_the_data_stale(make_env: MakeEnv, airflow: Airflow) -> None:
    """Partition 1's last record is two hours old, partition 0's are new: once ingest has read both
    to their end, the data is complete through then, and freshness passes."""
    env = make_env(partitions=2)
    _produce_with_timestamp(env, 6, datetime.now(UTC) - timedelta(hours=2), partition=1)
    _produce_with_timestamp(env, 6, datetime.now(UTC), partition=0)
    dag = airflow.dag(env)

    outcome = airflow.test(dag)

    assert outcome.state_of("ingest") == outcome.state_of("freshness") == "success"
    assert env.counts() == (12, 0)
    assert airflow.xcom(dag.dag_id, outcome.run_id, "freshness")["age_s"] < 600  # not two hours


def test_freshness_fails_when_nothing_was_ever_committed(
    make_env: MakeEnv, airflow: Airflow, capfd: pytest.CaptureFixture[str]
) -> None:
    env = make_env()
    env.produce(100)

    # the ingest task "succeeds" without running: a pipeline that never got to commit
    outcome = airflow.test(quick_retries(airflow.dag(env)), mark_success_pattern="ingest")

    assert outcome.state_of("freshness") == "failed"
    assert "has committed nothing" in capfd.readouterr().out
