"""A user's session with the CLI against the real broker and real catalogs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.integration.conftest import Env, MakeEnv

pytestmark = pytest.mark.integration


def _batches(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_run_until_caught_up_lands_every_record_once(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(5_000, bad_every=97)

    result = env.cli("run", "--until-caught-up", "--json")

    assert result.returncode == 0, result.stderr
    batches = _batches(result.stdout)
    assert [b["status"] for b in batches] == ["committed"] * len(batches)
    assert len(batches) == 3  # 5,000 records in batches of at most 2,000
    assert sum(b["records"] + b["dead_letters"] for b in batches) == 5_000
    assert env.counts() == (5_000 - env.bad, env.bad)
    env.verify()
    # lag dashboards read the consumer group: it holds the end of the last batch, 5,000 records in all
    # (a consumer's committed(): the admin client's list_consumer_group_offsets can crash on
    # NOT_COORDINATOR, librdkafka#5040)
    reader = Consumer({"bootstrap.servers": env.bootstrap, "group.id": env.config.group_id})
    committed = reader.committed([TopicPartition(env.topic, p) for p in range(env.partitions)], timeout=30)
    reader.close()
    assert sum(tp.offset for tp in committed) == 5_000


def test_default_run_is_one_batch_and_rerun_on_caught_up_writes_no_snapshot(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(1_000)
    first = env.cli("run", "--json")
    assert first.returncode == 0, first.stderr
    assert [b["status"] for b in _batches(first.stdout)] == ["committed"]

    again = env.cli("run", "--json")
    assert again.returncode == 0, again.stderr
    assert [b["status"] for b in _batches(again.stdout)] == ["empty"]
    history = json.loads(env.cli("history", "--json").stdout)
    assert [h["batch"] for h in history] == [1]


def test_status_history_and_verify_report_what_landed(make_env: MakeEnv) -> None:
    env = make_env(batch={"max_records": 600})
    env.produce(1_000, bad_every=50)
    assert env.cli("run", "--max-batches", "1").returncode == 0

    status = json.loads(env.cli("status", "--json").stdout)
    assert status["batch"] == 1
    assert sum(p["committed"] for p in status["partitions"]) == 600
    assert status["lag"] == 400
    assert status["valid_through_ms"] is not None

    env.cli("run", "--until-caught-up")
    status = json.loads(env.cli("status", "--json").stdout)
    assert status["lag"] == 0
    history = json.loads(env.cli("history", "--json").stdout)
    assert [h["batch"] for h in history] == [2, 1]
    assert sum(h["records"] + h["dead_letters"] for h in history) == 1_000
    assert sum(r["end"] - r["start"] for h in history for r in h["ranges"]) == 1_000
    data = env.verify()
    assert sum(p["rows"] for p in data["partitions"]) == 1_000 - env.bad
    assert sum(p["dead_letters"] for p in data["partitions"]) == env.bad

    human = env.cli("verify")
    assert human.returncode == 0 and "ok" in human.stdout


def test_dead_letters_keep_raw_record_and_error(make_env: MakeEnv) -> None:
    from ingest.assembly import open_pipeline

    env = make_env()
    env.produce(50, bad_every=5)
    assert env.cli("run").returncode == 0

    dead = open_pipeline(env.config).dead.table.scan().to_arrow().sort_by("offset").to_pylist()
    assert len(dead) == 10
    by_value = {d["value"]: d for d in dead}
    assert "not valid JSON" in by_value[b"{not json"]["error"]
    assert "required field(s) 'order_id'" in by_value[b'{"amount": 1}']["error"]
    assert "expected long" in by_value[b'{"order_id": "x"}']["error"]
    assert "not an object" in by_value[b"[1]"]["error"]
    assert "tombstone" in by_value[None]["error"]
    sample = dead[0]
    assert sample["topic"] == env.topic and sample["key"].startswith(b"k")
    assert sample["headers"][0]["key"] == "trace"
    assert sample["timestamp"] is not None


def test_table_rows_carry_kafka_coordinates(make_env: MakeEnv) -> None:
    from ingest.assembly import open_pipeline

    env = make_env(partitions=2)
    env.produce(10)
    assert env.cli("run").returncode == 0
    rows = open_pipeline(env.config).rows.table.scan().to_arrow().sort_by("order_id").to_pylist()
    first = rows[0]
    assert first["_kafka_topic"] == env.topic
    assert first["_kafka_partition"] == 0 and first["_kafka_offset"] == 0
    assert first["_kafka_key"] == b"k0"
    assert first["_kafka_timestamp"] is not None
    assert str(first["amount"]) == "0.25"
    assert first["created_at"].isoformat() == "2026-11-01T10:00:00+00:00"


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_the_read_only_commands_create_nothing_before_the_first_run(make_env: MakeEnv) -> None:
    """``status``, ``history`` and ``verify`` on a pipeline that never ran: they say so, and the
    catalog holds no table (and no namespace) afterwards."""
    from ingest.iceberg.catalog import connect

    env = make_env(partitions=2)
    env.produce(30)

    status = env.cli("status", "--json")
    history = env.cli("history", "--json")
    verify = env.cli("verify", "--json")
    said = env.cli("status")

    assert (status.returncode, history.returncode, verify.returncode) == (0, 0, 0), (status.stderr, verify.stderr)
    data = json.loads(status.stdout)
    assert data["batch"] is None and data["lag"] == 30 and "does not exist yet" in data["note"]
    assert json.loads(history.stdout) == []
    assert json.loads(verify.stdout)["note"].startswith("nothing committed yet")
    assert "no batch yet" in said.stdout and " None " not in said.stdout
    catalog = connect(env.config.catalog)
    assert not catalog.table_exists(env.config.table) and not catalog.table_exists(env.config.dead_letters)
    assert catalog.list_namespaces() == []


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_sigterm_stops_an_every_loop_between_batches_with_exit_143_and_says_so(make_env: MakeEnv) -> None:
    import signal

    env = make_env(partitions=2)
    env.produce(50)
    loop = env.popen("run", "--every", "2s", "--json")
    assert loop.stdout is not None
    first = json.loads(loop.stdout.readline())  # the first batch is in
    assert first["status"] == "committed"

    loop.send_signal(signal.SIGTERM)
    _, stderr = loop.communicate(timeout=60)

    assert loop.returncode == 143, stderr
    assert "stopped by SIGTERM between batches" in " ".join(stderr.split())
    env.produce(10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_an_every_loop_prints_a_line_per_batch_that_did_something_each_whole(make_env: MakeEnv) -> None:
    """Not on a terminal (Airflow, cron, a container's log): a line for each batch that committed,
    none for the idle ticks between, and no line broken at 80 columns."""
    import signal
    import time

    env = make_env(partitions=2)
    env.produce(50)
    loop = env.popen("run", "--every", "1s")
    assert loop.stdout is not None
    first = loop.stdout.readline()
    time.sleep(4)  # idle ticks
    env.produce(10)
    second = loop.stdout.readline()
    time.sleep(2)
    loop.send_signal(signal.SIGTERM)
    rest, _ = loop.communicate(timeout=60)

    assert first.startswith("batch 1: committed 50 rows") and first.rstrip().endswith(")"), first
    assert second.startswith("batch 2: committed 10 rows") and second.rstrip().endswith(")"), second
    assert rest == ""


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_history_shows_whole_snapshot_ids_and_every_range_at_80_columns(make_env: MakeEnv) -> None:
    env = make_env(partitions=3)
    env.produce(30)
    result = json.loads(env.cli("run", "--json").stdout.splitlines()[-1])

    shown = env.cli("history", env={"COLUMNS": "80"})

    assert shown.returncode == 0, shown.stderr
    assert str(result["snapshot_id"]) in shown.stdout  # what replay --from-snapshot takes, whole
    # each partition's range folded into the column, never cut to an ellipsis
    cells = "".join(line.split("│")[-2].strip() for line in shown.stdout.splitlines() if line.count("│") > 2)
    assert "…" not in shown.stdout
    for p in range(3):
        assert f"{env.topic}[{p}]" in cells


def _files(root: Path) -> dict[str, bytes]:
    """The catalog's database and the warehouse's files, byte for byte (the config beside them left out)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.suffix != ".yaml"
    }


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_check_says_what_a_run_would_meet_and_changes_nothing(make_env: MakeEnv) -> None:
    """``ingest check`` before the first run, after it, and on broken configs: the right step fails
    with the right code and message, and the catalog's database and the warehouse's files are
    byte-identical before and after every check."""
    env = make_env(partitions=2)
    env.produce(20)
    root = env.config_path.parent
    before = _files(root)

    fresh = env.cli("check", "--json")

    assert fresh.returncode == 0, fresh.stderr
    steps = {s["name"]: s for s in json.loads(fresh.stdout)["steps"]}
    assert [name for name in steps] == ["kafka", "catalog", "tables"] and all(s["ok"] for s in steps.values())
    assert "2 partitions" in steps["kafka"]["detail"] and "not created yet" in steps["tables"]["detail"]
    assert _files(root) == before

    assert env.cli("run").returncode == 0
    original = env.config_path.read_text()
    ran = _files(root)
    assert env.cli("check").returncode == 0
    as_string = [dict(f, type="string") if f["name"] == "order_id" else f for f in yaml.safe_load(original)["schema"]]
    broken: list[tuple[dict[str, Any], int, str, str]] = [
        ({"kafka": {"bootstrap.servers": env.bootstrap, "socket.timeout.mz": 5}}, 78, "kafka", "socket.timeout.mz"),
        ({"topics": ["no-such-topic"]}, 65, "kafka", "no-such-topic"),
        ({"partition_by": ["bucket(4, order_id)"]}, 65, "tables", "the table is partitioned by"),
        ({"schema": as_string}, 65, "tables", "order_id"),
        ({"table_properties": {"write.parquet.compression-codec": "snappy"}}, 65, "tables", "compression-codec"),
        ({"sort_by": ["order_id desc"]}, 65, "tables", "the table is sorted by []"),
    ]
    for change, code, name, says in broken:
        env.config_path.write_text(yaml.safe_dump({**yaml.safe_load(original), **change}))
        result = env.cli("check", "--json")
        assert result.returncode == code, (change, result.stdout, result.stderr)
        failed = [s for s in json.loads(result.stdout)["steps"] if not s["ok"]]
        assert [s["name"] for s in failed] == [name] and says in failed[0]["detail"], (change, failed)
        assert _files(root) == ran, change


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_json_log_lines_say_which_pipeline_batch_and_snapshot_they_are_about(make_env: MakeEnv) -> None:
    env = make_env(partitions=1, batch={"max_records": 30})
    env.produce(50, bad_every=10)

    result = env.cli("run", "--until-caught-up", "-v", "--log-format", "json", "--json")

    assert result.returncode == 0, result.stderr
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    committed = [line for line in logged if line.get("status") == "committed"]
    assert [(c["pipeline"], c["batch"], c["records"], c["dead_letters"]) for c in committed] == [
        ("orders", 1, 27, 3),
        ("orders", 2, 18, 2),
    ]
    snapshots = [b["snapshot_id"] for b in _batches(result.stdout)]
    assert [c["snapshot_id"] for c in committed] == snapshots


#: ``ingest`` whose first batch, once its files are written, lets a copy of the pipeline with a larger
#: batch (the config in INGEST_TEST_RACER) commit first: the batch is fenced and planned again
_FENCED_RUN = """
import os, subprocess, sys
from ingest.engines.local import LocalEngine
from ingest.__main__ import main

produce = LocalEngine.produce
raced_once = []

def raced(self, batch, fields, advanced=None):
    produced = produce(self, batch, fields, advanced)
    if not raced_once:
        raced_once.append(batch.number)
        racer = [sys.executable, "-m", "ingest", "run", "-c", os.environ["INGEST_TEST_RACER"]]
        subprocess.run(racer, check=True, capture_output=True)
    return produced

LocalEngine.produce = raced
sys.argv[0] = "ingest"
main()
"""


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_fenced_batch_is_not_reported_without_verbose(make_env: MakeEnv) -> None:
    """A batch fenced by another copy is planned again, a normal outcome with several copies: a run
    without -v prints only its result (docs/usage.md's promise), with -v the fencing too."""
    env = make_env(partitions=2, batch={"max_records": 100})
    racer = env.config_path.with_name("racer.yaml")
    racer.write_text(yaml.safe_dump({**yaml.safe_load(env.config_path.read_text()), "batch": {"max_records": 150}}))
    outcomes = []
    for verbose in ([], ["-v"]):
        env.produce(150)
        outcomes.append(
            subprocess.run(
                [sys.executable, "-c", _FENCED_RUN, "run", *verbose, "--json", "-c", str(env.config_path)],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "INGEST_TEST_RACER": str(racer)},
            )
        )

    for outcome in outcomes:
        assert outcome.returncode == 0, outcome.stderr
        [result] = _batches(outcome.stdout)
        assert result["commit_retries"]["fenced"] == 1, result  # the racer's batch landed first
    quiet, verbose_run = outcomes
    assert quiet.stderr == "", quiet.stderr
    assert "was fenced by another writer; planning again" in verbose_run.stderr
    env.verify()


def test_run_help_says_a_bare_every_is_seconds() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "ingest", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )

    assert shown.returncode == 0, shown.stderr
    assert "one catch-up every DURATION, such as 30s, 5m or 1h (a bare number is seconds)" in shown.stdout


def _to_partition(env: Env, partition: int, first: int, count: int, timestamp_ms: int | None = None) -> None:
    """Records ``first..first+count`` to one partition, stamped ``timestamp_ms`` (None: now)."""
    from confluent_kafka import Producer

    from tests.integration.conftest import record

    producer = Producer({"bootstrap.servers": env.bootstrap})
    for i in range(first, first + count):
        _, key, value, headers = record(i, 1, None)
        if i == first + count - 1:  # the last in a request of its own: tansu reports the end right then
            producer.flush(30)
        producer.produce(
            env.topic,
            value=value,
            key=key,
            partition=partition,
            headers=list(headers),
            timestamp=timestamp_ms if timestamp_ms is not None else 0,  # 0, the default: now
        )
    producer.flush(30)


def test_an_idle_partition_does_not_hold_data_complete_through_back(make_env: MakeEnv) -> None:
    import time

    from ingest.assembly import open_pipeline

    env = make_env(partitions=2, batch={"max_records": 50, "read_timeout_s": 20})
    idle_last = int(time.time() * 1000) - 3_600_000  # partition 1's records are an hour old
    _to_partition(env, 1, 0, 20, idle_last)
    _to_partition(env, 0, 100, 20)
    before = int(time.time() * 1000)

    assert env.cli("run", "--until-caught-up").returncode == 0

    status = json.loads(env.cli("status", "--json").stdout)
    assert status["lag"] == 0
    # both partitions read to their end: complete through when the run read their ends
    assert before <= status["valid_through_ms"] <= int(time.time() * 1000)

    # partition 0 gets more records than a batch takes, partition 1 none
    _to_partition(env, 0, 200, 80)
    assert env.cli("run", "--max-batches", "1").returncode == 0

    status = json.loads(env.cli("status", "--json").stdout)
    assert [(p["partition"], p["lag"]) for p in status["partitions"]] == [(0, 30), (1, 0)]
    rows = open_pipeline(env.config).rows.scan_columns(["_kafka_partition", "_kafka_timestamp"]).to_pylist()
    busy_last = max(int(r["_kafka_timestamp"].timestamp() * 1000) for r in rows if r["_kafka_partition"] == 0)
    # the busy partition, behind, is complete through its newest committed record; the idle one,
    # read to its end again, no longer holds the table at its last record an hour ago
    assert status["valid_through_ms"] == busy_last > idle_last
    history = json.loads(env.cli("history", "--json").stdout)
    assert history[0]["valid_through_ms"] == busy_last
    env.verify()
