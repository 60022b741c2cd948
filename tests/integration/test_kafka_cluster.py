"""A three-node Apache Kafka cluster losing brokers while a pipeline runs.

The topic has three replicas and ``min.insync.replicas=2``; producers use ``acks=all``
(idempotence). Each test kills brokers with SIGKILL while ``ingest run --until-caught-up`` is
committing batch after batch, then checks the table holds every acknowledged record exactly once
(``ingest verify`` included); and a run whose consumer group has lost its coordinator. The cluster
is this module's own, so the session broker is untouched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import Env, MakeEnv, broker_choice, record
from tests.services import kafka as kafka_service

pytestmark = [
    pytest.mark.integration,
    # on tansu or an external cluster; where Apache Kafka cannot run, a strict run fails here (tests/strict.py)
    pytest.mark.skipif(
        broker_choice()[0] in ("tansu", "external"), reason="starts its own Apache Kafka: " + broker_choice()[1]
    ),
    pytest.mark.parametrize("catalog_kind", ["sqlite"]),  # the brokers are under test here, not the catalogs
]

RECORDS = 60_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_service.KafkaCluster]:
    settings = {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        # the controller fences a silent broker after 3 s (default 9 s), so leadership moves quickly
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # a consumer group's offsets on one broker only: killing it leaves the group no coordinator
        "offsets.topic.replication.factor": "1",
    }
    with kafka_service.KafkaCluster(tmp_path_factory.mktemp("cluster"), nodes=3, settings=settings) as started:
        yield started


def _leader(env: Env, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": env.bootstrap}).list_topics(env.topic, timeout=10)
    return int(metadata.topics[env.topic].partitions[partition].leader)


def _coordinator(bootstrap: str, group: str, partitions: list[tuple[str, int]]) -> int:
    """The broker coordinating ``group``, once the group exists (offsets at 0: nothing skipped)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, p, 0) for topic, p in partitions], asynchronous=False)
    consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the future is done
    return int(admin.describe_consumer_groups([group])[group].result(30).coordinator.id)


def _first_batch(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The first batch the running ``ingest run --json`` reports (it is committed by then)."""
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    assert line, process.stderr.read()
    batch: dict[str, Any] = json.loads(line)
    return batch


class _Producing(threading.Thread):
    """Sends records ``first..first+count`` with ``acks=all`` while brokers fail; every record must
    be acknowledged in the end (the idempotent producer retries through leader changes)."""

    def __init__(self, env: Env, first: int, count: int) -> None:
        super().__init__(daemon=True)
        self.env, self.first, self.count = env, first, count
        self.failed: list[str] = []

    def run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.env.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
        )

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self.failed.append(str(error))

        for i in range(self.first, self.first + self.count):
            partition, key, value, headers = record(i, self.env.partitions, None)
            producer.produce(
                self.env.topic, value, key, partition=partition, headers=list(headers), on_delivery=delivered
            )
            producer.poll(0)
            if i % 500 == 0:
                time.sleep(0.01)  # spread over the failover instead of one burst before it
        left = producer.flush(120)
        if left:
            self.failed.append(f"{left} records still unacknowledged after 120s")


def _exact(env: Env, expected: int) -> None:
    from ingest.assembly import open_pipeline

    ids = open_pipeline(env.config).rows.scan_columns(["order_id"])["order_id"].to_pylist()
    assert len(ids) == expected, f"{len(ids)} rows for {expected} acknowledged records"
    assert sorted(ids) == list(range(expected)), "a record is missing or doubled"
    env.verify()


def test_the_leader_dies_mid_run_and_a_follower_takes_over(
    make_env: MakeEnv, cluster: kafka_service.KafkaCluster
) -> None:
    env = make_env(partitions=3, cluster=cluster.bootstrap_servers, replicas=3, batch={"max_records": 1_500})
    env.produce(RECORDS)
    victim = _leader(env, 0)
    run = env.popen("run", "--until-caught-up", "--json")
    more = _Producing(env, RECORDS, 20_000)
    try:
        _first_batch(run)
        more.start()
        assert run.poll() is None, "the run finished before the broker died: the test would prove nothing"
        cluster.stop_node(victim, signal.SIGKILL)
        _, err = run.communicate(timeout=300)
        more.join(300)
        assert not more.is_alive() and not more.failed, more.failed
        assert _leader(env, 0) != victim
        # the run either rode the failover out or stopped with the retryable code, nothing half-done
        assert run.returncode in (0, 75), err
        if run.returncode == 75:
            assert "error (retryable" in err, err

        rerun = env.cli("run", "--until-caught-up", "--json")  # on two of the three brokers

        assert rerun.returncode == 0, rerun.stderr
        _exact(env, RECORDS + 20_000)
    finally:
        run.kill()
        cluster.start_node(victim)


def test_every_broker_restarts_mid_run(make_env: MakeEnv, cluster: kafka_service.KafkaCluster) -> None:
    env = make_env(
        partitions=3,
        cluster=cluster.bootstrap_servers,
        replicas=3,
        batch={"max_records": 1_500, "read_timeout_s": 8},
    )
    env.produce(RECORDS)
    run = env.popen("run", "--until-caught-up", "--json")
    try:
        first = _first_batch(run)
        assert run.poll() is None, "the run finished before the brokers stopped: the test would prove nothing"
        for node in cluster.nodes:
            cluster.stop_node(node.node_id, signal.SIGKILL)
        out, err = run.communicate(timeout=300)

        assert run.returncode == 75, err  # the batch cannot finish: retryable, and it says why
        assert "error (retryable, BrokerUnavailable)" in err and "run again" in err.lower(), err
        *batches, error = [first, *map(json.loads, out.splitlines())]
        assert error["kind"] == "retryable" and error["type"] == "BrokerUnavailable", error  # the --json form
        committed = sum(batch["records"] for batch in batches)
        for node in cluster.nodes:
            cluster.start_node(node.node_id, wait=False)
        cluster.wait_ready()

        rerun = env.cli("run", "--until-caught-up", "--json")

        assert rerun.returncode == 0, rerun.stderr
        resumed = [json.loads(line) for line in rerun.stdout.splitlines()]
        assert resumed[0]["ranges"][0]["start"] > 0  # carried on from the ledger, not from the start
        assert committed + sum(b["records"] for b in resumed) == RECORDS
        _exact(env, RECORDS)
    finally:
        run.kill()
        for node in cluster.nodes:
            if node.process is None:
                cluster.start_node(node.node_id, wait=False)
        cluster.wait_ready()


def test_a_consumer_group_without_a_coordinator_holds_no_batch(
    make_env: MakeEnv, cluster: kafka_service.KafkaCluster
) -> None:
    """The group's advisory offsets (lag dashboards) are never waited for: with the broker that
    holds the group's offsets dead, a catch-up of ten batches lands at full speed (each batch waited
    ``read_timeout_s``, 30 s, for the coordinator's answer: over five minutes in all) and says the
    offsets were not stored."""
    env = make_env(partitions=3, cluster=cluster.bootstrap_servers, replicas=3, batch={"max_records": 1_500})
    env.produce(15_000)
    group = env.config.group_id
    victim = _coordinator(env.bootstrap, group, [(env.topic, p) for p in range(env.partitions)])
    cluster.stop_node(victim, signal.SIGKILL)
    try:
        deadline = time.monotonic() + 60
        while any(_leader(env, p) in (victim, -1) for p in range(env.partitions)):  # the topic's leaders move
            assert time.monotonic() < deadline, "the partitions' leadership never left the dead broker"
            time.sleep(0.5)

        result = env.cli("run", "--until-caught-up", "--json", timeout=150)

        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 10
        assert f"advisory offsets of consumer group {group!r} not stored (ignored)" in result.stderr
        _exact(env, 15_000)
    finally:
        cluster.start_node(victim)
