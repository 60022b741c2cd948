"""The local engine's worker processes: a large batch is shared out, and no crash of either side
loses or doubles a record or leaves a process behind."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ingest.assembly import open_pipeline
from ingest.core.ledger import TopicPartition
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.engines.local import LocalEngine
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import TaskOutput
from ingest.engines.workers import Task, WorkerPool
from ingest.errors import BrokerUnavailable, WorkerLost
from ingest.failpoints import POINTS
from ingest.kafka.admin import create_topic
from ingest.kafka.embedded import EmbeddedBroker
from ingest.kafka.reading import READ_CHUNK_RECORDS
from tests.integration.conftest import MakeEnv, gone, workers_of

pytestmark = pytest.mark.integration

SHARED = {"max_records": 6_000, "chunk_records": 500, "workers": 3, "read_timeout_s": 20}


def test_running_workers_take_equal_shares_before_anything_is_read(
    make_env: MakeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env(batch=SHARED)
    env.produce(6_000, bad_every=11)
    pipeline = open_pipeline(env.config)

    with caplog.at_level(logging.INFO, logger="ingest.engines.local"), LocalEngine(env.config, pipeline.rows) as engine:
        engine.start_workers(wait=True)
        result = pipeline.run_batch(engine)

    assert result.status == "committed"
    assert "batch 1: 6000 records shared between this process and 2 workers (4000 read by the workers)" in caplog.text
    assert gone(os.getpid()), "workers outlived their engine"
    assert env.counts() == (6_000 - env.bad, env.bad)
    env.verify()


def test_workers_started_by_a_run_leave_with_it(make_env: MakeEnv) -> None:
    """Workers start when the first large batch needs them and take a share of what is left unread
    when their imports are done (often nothing, for batches this small): the result is exact either way."""
    env = make_env(batch=SHARED)
    env.produce(12_000, bad_every=11)

    process = env.popen("-v", "run", "--until-caught-up", "--json")
    _, stderr = process.communicate(timeout=300)

    assert process.returncode == 0, stderr
    assert "6000 records shared between this process and" in stderr
    assert gone(process.pid), "workers outlived a run that ended normally"
    assert env.counts() == (12_000 - env.bad, env.bad)
    env.verify()


def test_a_run_starts_the_workers_its_backlog_needs_before_opening_the_catalog(make_env: MakeEnv) -> None:
    """The backlog is guessed from the consumer group's offsets, which each batch leaves at its end."""
    env = make_env(batch=SHARED)
    for produced, workers in ((6_000, 2), (900, 0)):  # 900: under two chunks of 500, this process alone
        env.produce(produced)
        process = env.popen("-v", "run")
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        group = f"{produced} records past the offsets of consumer group 'ingest-orders'"
        assert f"Kafka holds {group}: {workers} workers start before the catalog opens" in stderr
    assert env.counts() == (6_900, 0)
    env.verify()


def test_a_run_that_ends_while_its_workers_start_stops_them_quietly(make_env: MakeEnv) -> None:
    """One small batch is read and committed before the worker processes it started have imported
    what they need: the run ends without waiting for them, and they leave no error behind."""
    env = make_env(batch=SHARED)
    env.produce(3_000)

    process = env.popen("-v", "run")
    _, stderr = process.communicate(timeout=300)

    assert process.returncode == 0, stderr
    assert "3000 records shared between this process and" in stderr  # 0 workers, unless a slow read let one join
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert gone(process.pid)
    assert env.counts() == (3_000, 0)


@pytest.mark.crash
@pytest.mark.parametrize("point", POINTS)
def test_engine_killed_at_each_step_leaves_no_worker_behind(make_env: MakeEnv, point: str) -> None:
    env = make_env(batch=SHARED)
    env.produce(6_000, bad_every=11)

    killed = env.popen("run", env={"INGEST_FAILPOINT": point})
    _, stderr = killed.communicate(timeout=300)

    assert killed.returncode == -signal.SIGKILL, stderr
    assert gone(killed.pid), f"workers of the killed engine still run: {workers_of(killed.pid)}"
    rerun = env.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    env.exact()


@pytest.mark.crash
@pytest.mark.parametrize("point", ["mid-read", "mid-write"])
def test_a_killed_worker_fails_the_batch_retryably(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """What the OOM killer does to a worker: the batch stops, nothing is committed, a rerun completes it."""
    env = make_env(batch=SHARED)
    env.produce(6_000, bad_every=11)
    pipeline = open_pipeline(env.config)
    monkeypatch.setenv("INGEST_WORKER_FAILPOINT", point)  # the workers inherit it

    with LocalEngine(env.config, pipeline.rows) as engine:
        engine.start_workers(wait=True)
        with pytest.raises(WorkerLost, match=r"was killed by signal 9.*nothing was committed"):
            pipeline.run_batch(engine)

    assert gone(os.getpid())
    assert pipeline.rows.table.metadata.snapshots == [] and pipeline.dead.table.metadata.snapshots == []
    monkeypatch.delenv("INGEST_WORKER_FAILPOINT")
    rerun = env.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    env.exact()


def test_what_crosses_to_workers_holds_no_catalog_credentials(make_env: MakeEnv) -> None:
    """A task carries the Kafka properties it reads with and the storage properties it writes with;
    the catalog's URI, user and secrets stay in the process that commits."""
    env = make_env()
    config = env.config.model_copy(update={"catalog": {**env.config.catalog, "token": "catalog-s3cr3t"}})
    rows = open_pipeline(config).rows
    assert rows.table.io.properties.get("token") == "catalog-s3cr3t"  # the committing process holds it

    shipped = pickle.dumps(
        Task(TaskSpec.of(config, config.schema_ or []), rows.detached(), 1, [(TopicPartition(env.topic, 0), 0, 10)])
    )

    assert b"catalog-s3cr3t" not in shipped
    assert str(config.catalog["uri"]).encode() not in shipped
    assert env.bootstrap.encode() in shipped  # what the task needs is there


def test_an_error_in_a_worker_is_raised_with_its_kind(make_env: MakeEnv) -> None:
    """A worker whose broker does not answer: the engine gets the worker's BrokerUnavailable, and the
    pool's processes are stopped."""
    env = make_env(batch={"read_timeout_s": 1})
    pipeline = open_pipeline(env.config)
    unreachable = env.config.model_copy(update={"kafka": {"bootstrap.servers": "127.0.0.1:9"}})
    pool = WorkerPool(1)
    task = Task(
        TaskSpec.of(unreachable, pipeline.fields), pipeline.rows.detached(), 1, [(TopicPartition(env.topic, 0), 0, 10)]
    )
    handed = threading.Event()

    def hand_off(parts: int) -> list[Task]:
        handed.set()
        return [task]

    def meanwhile() -> TaskOutput:
        assert handed.wait(60), "the worker never asked for work"
        return TaskOutput(0, [], DeadLetterSpool(), 0, 0, {}, ())

    with pytest.raises(BrokerUnavailable, match="no progress from Kafka"):
        pool.run(1, hand_off, lambda point: None, lambda records, nbytes, files: None, meanwhile)
    assert gone(os.getpid())


WORKER_STUCK = """
import sys, threading
from ingest import config
from ingest.core.ledger import TopicPartition
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import TaskOutput
from ingest.engines.workers import Task, WorkerPool
from ingest.assembly import open_pipeline

cfg = config.load(sys.argv[1])
rows = open_pipeline(cfg).rows.detached()
handed = threading.Event()

def hand_off(parts):
    handed.set()
    return [Task(TaskSpec.of(cfg, cfg.schema_ or []), rows, 1, [(TopicPartition(sys.argv[2], 0), 0, int(sys.argv[3]))])]

def meanwhile():  # this process's own share: nothing, once the worker has its task
    assert handed.wait(120), "the worker never asked for work"
    return TaskOutput(0, [], DeadLetterSpool(), 0, 0, {}, ())

# the points the worker reaches (mid-read: its first chunk is in) are printed as it reports them
WorkerPool(1).run(1, hand_off, lambda point: print(point, flush=True), lambda *_: None, meanwhile)
"""


@pytest.mark.crash
def test_a_worker_stuck_on_a_hung_broker_exits_when_the_engine_is_killed(make_env: MakeEnv, tmp_path: Path) -> None:
    """A killed Airflow task whose worker waits on a broker that stopped answering: the worker must
    not sit out its read timeout (two minutes here). The worker's range runs past the partition's
    end, so once it reports its first chunk read (``mid-read``) it is fetching, for certain, when
    the broker stops."""
    with EmbeddedBroker(log_path=tmp_path / "own-broker.log") as broker:
        env = make_env(
            partitions=1, batch={"read_timeout_s": 120}, kafka={"bootstrap.servers": broker.bootstrap_servers}
        )
        env.bootstrap = broker.bootstrap_servers
        create_topic(broker.bootstrap_servers, env.topic, env.partitions)
        env.produce(READ_CHUNK_RECORDS)  # one read chunk: what makes a task report mid-read
        assert broker.pid is not None
        engine = subprocess.Popen(
            [sys.executable, "-c", WORKER_STUCK, str(env.config_path), env.topic, str(READ_CHUNK_RECORDS + 100)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert engine.stdout is not None and engine.stdout.readline() == "mid-read\n"
            os.kill(broker.pid, signal.SIGSTOP)
            assert workers_of(engine.pid), "the worker is gone"
            engine.kill()
            engine.wait()
            assert gone(engine.pid, timeout_s=5.0), "the worker outlived its engine"
        finally:
            os.kill(broker.pid, signal.SIGCONT)
            engine.kill()
