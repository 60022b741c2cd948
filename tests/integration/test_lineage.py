"""OpenLineage run events of real runs (Apache Kafka, a SQLite catalog), received by a real HTTP
server on a free port, as Marquez or DataHub would receive them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingest.iceberg.catalog import connect
from ingest.kafka.embedded import free_port
from tests.integration.conftest import Env, MakeEnv

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]


class Receiver:
    """An HTTP endpoint that keeps every event posted to ``/api/v1/lineage``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.paths.append(self.path)
                received.events.append(json.loads(body))
                self.send_response(201)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _with(env: Env, **changes: Any) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    env.config_path.write_text(yaml.safe_dump({**data, **changes}))


def _facet(dataset: dict[str, Any], name: str) -> dict[str, Any]:
    facet: dict[str, Any] = dataset["facets"][name]
    return facet


def test_a_run_sends_start_and_complete_naming_its_topics_tables_and_snapshot(
    make_env: MakeEnv, receiver: Receiver
) -> None:
    env = make_env(partitions=2, batch={"max_records": 40})
    env.produce(100, bad_every=10)

    ran = env.cli("run", "--until-caught-up", env={"OPENLINEAGE_URL": receiver.url, "OPENLINEAGE_NAMESPACE": "prod"})
    assert ran.returncode == 0, ran.stderr

    start, complete = receiver.events
    assert receiver.paths == ["/api/v1/lineage"] * 2
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"]
    assert complete["job"]["namespace"] == "prod" and complete["job"]["name"] == "orders"
    host, port = env.bootstrap.split(",")[0].rsplit(":", 1)
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [(f"kafka://{host}:{port}", env.topic)]

    rows, dead = complete["outputs"]
    config = env.config
    for output, table in ((rows, config.table), (dead, config.dead_letters)):
        assert output["namespace"] == "file" and output["name"].startswith("/")
        [identifier] = _facet(output, "symlinks")["identifiers"]
        assert identifier == {"namespace": f"iceberg://{config.catalog['name']}", "name": table, "type": "TABLE"}
        assert _facet(output, "catalog")["framework"] == "iceberg"
    columns = {field["name"]: field["type"] for field in _facet(rows, "schema")["fields"]}
    assert columns["_kafka_offset"] == "long" and {f.name for f in config.schema_ or []} <= set(columns)

    history = json.loads(env.cli("history", "--json").stdout.splitlines()[0])
    newest = history[0]["snapshot_id"]  # (newest first)
    assert _facet(rows, "version")["datasetVersion"] == str(newest)  # the exact snapshot the run ended on
    dead_snapshot = connect(config.catalog).load_table(config.dead_letters).current_snapshot()
    assert dead_snapshot is not None and _facet(dead, "version")["datasetVersion"] == str(dead_snapshot.snapshot_id)
    assert rows["outputFacets"]["outputStatistics"]["rowCount"] == 100 - env.bad
    assert dead["outputFacets"]["outputStatistics"]["rowCount"] == env.bad

    ledger = complete["run"]["facets"]["lakehouseIngest"]
    assert ledger["_schemaURL"].endswith("LakehouseIngestRunFacet.json")
    assert [b["batch"] for b in ledger["batches"]] == [1, 2, 3]
    assert {b["snapshotId"] for b in ledger["batches"]} == {e["snapshot_id"] for e in history}
    read = sum(r["end"] - r["start"] for b in ledger["batches"] for r in b["ranges"])
    assert read == 100
    assert complete["run"]["facets"]["processing_engine"]["name"] == "lakehouse-ingest"
    env.verify()


def test_a_failing_run_sends_fail_and_the_config_block_says_where(make_env: MakeEnv, receiver: Receiver) -> None:
    env = make_env()
    env.produce(10)
    _with(env, lineage={"url": receiver.url, "namespace": "staging"})
    assert env.cli("run").returncode == 0
    _with(env, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})  # the broker is gone

    failed = env.cli("run")

    assert failed.returncode == 75, failed.stderr
    states = [event["eventType"] for event in receiver.events]
    assert states == ["START", "COMPLETE", "FAIL"] or states == ["START", "COMPLETE", "START", "FAIL"], states
    fail = receiver.events[-1]
    assert fail["job"] == {**fail["job"], "namespace": "staging", "name": "orders"}
    error = fail["run"]["facets"]["errorMessage"]
    assert error["programmingLanguage"] == "python" and "BrokerUnavailable" in error["message"]


def test_a_lineage_backend_that_is_down_never_fails_a_run(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env()
    env.produce(20)
    textfile = tmp_path / "ingest.prom"
    _with(env, lineage={"url": f"http://127.0.0.1:{free_port()}", "timeout_s": 1}, metrics={"textfile": str(textfile)})

    ran = env.cli("run")

    assert ran.returncode == 0, ran.stderr
    assert "OpenLineage: could not send the START event of orders" in ran.stderr
    failures = [
        s.value
        for family in text_string_to_metric_families(textfile.read_text())
        for s in family.samples
        if s.name == "ingest_lineage_failures_total"
    ]
    assert failures == [2]  # START and COMPLETE, counted
    assert env.counts() == (20, 0)


def test_no_event_without_a_destination(make_env: MakeEnv, receiver: Receiver, tmp_path: Path) -> None:
    env = make_env()
    env.produce(5)
    assert env.cli("run").returncode == 0
    assert receiver.events == []
