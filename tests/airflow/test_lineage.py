"""Airflow's OpenLineage provider reports an ingest task's lineage (the operator's
``get_openlineage_facets_on_complete``), and the run sends no events of its own beside it: a real
``airflow dags test`` in its own process, the provider's HTTP transport posting to a real HTTP
receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Env, MakeEnv
from tests.integration.test_lineage import Receiver

from .conftest import NEEDS_AIRFLOW, Airflow, dag_id

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)
pytest.importorskip("airflow.providers.openlineage", reason="pip install apache-airflow-providers-openlineage")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_the_providers_events_carry_the_tasks_topics_tables_and_ledger(
    make_env: MakeEnv, airflow: Airflow, receiver: Receiver
) -> None:
    env: Env = make_env(partitions=2)
    env.produce(200, bad_every=10)
    transport = json.dumps({"type": "http", "url": receiver.url})

    test = airflow.cli(
        "dags",
        "test",
        dag_id(env),
        env={"AIRFLOW__OPENLINEAGE__TRANSPORT": transport, "AIRFLOW__OPENLINEAGE__NAMESPACE": "airflow-test"},
    )
    output, _ = test.communicate(timeout=300)
    assert test.returncode == 0, output[-3000:]

    task = [e for e in receiver.events if e["job"]["name"] == f"{dag_id(env)}.ingest"]
    [complete] = [e for e in task if e["eventType"] == "COMPLETE"]
    assert complete["job"]["namespace"] == "airflow-test"
    assert [d["name"] for d in complete["inputs"]] == [env.topic]
    assert complete["inputs"][0]["namespace"].startswith("kafka://")
    tables = [i["name"] for d in complete["outputs"] for i in d["facets"]["symlinks"]["identifiers"]]
    assert tables == [env.config.table, env.config.dead_letters]
    ledger = complete["run"]["facets"]["lakehouseIngest"]
    assert sum(r["end"] - r["start"] for b in ledger["batches"] for r in b["ranges"]) == 200
    # no double events: the run sent none of its own (its job would be the pipeline's id)
    assert not [e for e in receiver.events if e["job"]["name"] == env.config.pipeline]
    assert env.counts() == (200 - env.bad, env.bad)
