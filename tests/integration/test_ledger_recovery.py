"""Recovering a lost ledger with ``ingest reset``, driven through the CLI as a user would.

The ledger is lost the way another tool loses it (Spark's ``rewrite_data_files`` followed by
``expire_snapshots(retain_last => 1)``): every row is rewritten into a snapshot without the ledger
and every older snapshot expires.
"""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc
import pytest

from ingest.assembly import Opened, open_pipeline
from ingest.core.plan import KafkaView, Watermarks
from ingest.errors import ExitCode, FatalError, TopicRecreated
from ingest.iceberg.table import IcebergTable
from ingest.ops.reset import reset
from ingest.ops.reset_command import ResetTarget
from ingest.records import DEAD_LETTERS, ROWS
from tests.integration.conftest import Env, MakeEnv, needs_apache_kafka, summary_of
from tests.runs import head_ledger

pytestmark = pytest.mark.integration


def _lose_ledger(table: IcebergTable) -> None:
    """Rewrite every data file into a snapshot without the ledger, then expire all older snapshots."""
    iceberg = table.table.refresh()
    iceberg.overwrite(iceberg.scan().to_arrow())
    iceberg = iceberg.refresh()
    iceberg.maintenance.expire_snapshots().older_than(datetime.now(tz=UTC)).commit()
    assert not any("ingest.orders.offsets" in summary_of(s) for s in iceberg.refresh().snapshots())


def _snapshot_counts(pipeline: Opened) -> list[int]:
    """How many snapshots the rows table and the dead-letter table have now."""
    counts = []
    for table in (pipeline.rows, pipeline.dead):
        table.refresh()
        counts.append(len(table.table.metadata.snapshots))
    return counts


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, (result.stdout, result.stderr)
    document: dict[str, Any] = json.loads(result.stdout.splitlines()[0])
    return document


def _fails_closed(env: Env, table: str) -> None:
    result = env.cli("run", "--json")
    assert result.returncode == ExitCode.FATAL, (result.stdout, result.stderr)
    error = json.loads(result.stdout.splitlines()[0])
    assert error["type"] == "LedgerLost" and f"table {table} " in error["error"]
    assert 'ingest reset -c <config> --from-table --reason "..."' in error["error"]


def _assert_exactly_once(env: Env) -> None:
    assert env.counts() == (env.produced - env.bad, env.bad)
    pipeline = open_pipeline(env.config)
    for table, coordinates_of in ((pipeline.rows, ROWS), (pipeline.dead, DEAD_LETTERS)):
        columns = coordinates_of.names
        coordinates = table.scan_columns(list(columns[:3]))
        if coordinates.num_rows:
            copies = coordinates.group_by(list(columns[:3])).aggregate([([], "count_all")])["count_all"]
            assert pc.max(copies).as_py() == 1, f"duplicate Kafka coordinates in {table.identifier}"
    env.verify()


def _offsets(report: dict[str, Any]) -> dict[int, tuple[int, str]]:
    return {p["partition"]: (p["to"], p["basis"]) for p in report["offsets"]}


def test_from_table_rebuilds_both_lost_ledgers_once_and_ingestion_resumes_exactly(make_env: MakeEnv) -> None:
    env = make_env(partitions=3)
    env.produce(903, bad_every=7)  # the last record, offset 300 of partition 2, is a dead letter
    assert env.cli("run", "--until-caught-up").returncode == 0
    pipeline = open_pipeline(env.config)
    before = head_ledger(pipeline).ledger.offsets
    _lose_ledger(pipeline.rows)
    _lose_ledger(pipeline.dead)
    env.produce(300, bad_every=7)
    _fails_closed(env, pipeline.rows.identifier)

    command = ("reset", "--from-table", "--reason", "INC-7: Spark expiry removed the ledger", "--json")
    applied = _json(env.cli(*command))
    again = _json(env.cli(*command))

    assert (applied["status"], applied["recovered"]) == ("applied", True)
    # exact where the table ends: the old ledger, except that the trailing dead letter is read again
    assert _offsets(applied) == {0: (before[min(before)], "table"), 1: (301, "table"), 2: (300, "table")}
    assert sorted(before.values()) == [301, 301, 301]
    assert {p["partition"]: p["floor"] for p in applied["dead_letter_floor"]["offsets"]} == {0: 301, 1: 301, 2: 301}
    assert (again["status"], again["snapshot_id"]) == ("already-applied", applied["snapshot_id"])
    history = json.loads(env.cli("history", "--json").stdout)
    assert len(history) == 1  # one ledger snapshot: the reset, applied once
    pipeline.rows.refresh()
    summary = summary_of(pipeline.rows.table.metadata.snapshot_by_id(applied["snapshot_id"]))
    assert summary["ingest.orders.reset-recovered"] == "true"

    assert env.cli("run", "--until-caught-up").returncode == 0
    _assert_exactly_once(env)


def test_from_table_after_a_crash_between_the_two_commits_then_both_ledgers_lost(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(400, bad_every=9)
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.produce(400, bad_every=9)
    killed = env.cli("run", env={"INGEST_FAILPOINT": "between-commits"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the rows of offsets 200..399 are stored, their dead letters only in files the lost ledger named
    pipeline = open_pipeline(env.config)
    _lose_ledger(pipeline.rows)
    _lose_ledger(pipeline.dead)
    _fails_closed(env, pipeline.rows.identifier)

    applied = _json(env.cli("reset", "--from-table", "--reason", "restore after crash", "--json"))

    # resumed after the newest row; the dead letters below it that the crash left in files added
    offsets = {p: o for p, (o, _) in _offsets(applied).items()}
    assert offsets[0] > 390 and offsets[1] > 390
    assert env.counts()[1] == env.bad - sum(1 for i in range(800) if i % 9 == 8 and i // 2 >= offsets[i % 2])
    assert env.cli("run", "--until-caught-up").returncode == 0
    _assert_exactly_once(env)


def test_lost_dead_letter_ledger_fails_closed_and_from_table_restores_only_the_floor(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(400, bad_every=9)
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.produce(400, bad_every=9)
    assert env.cli("run", env={"INGEST_FAILPOINT": "between-commits"}).returncode == -signal.SIGKILL
    pipeline = open_pipeline(env.config)
    rows_ledger = pipeline.ledger()
    assert rows_ledger is not None
    _lose_ledger(pipeline.dead)
    _fails_closed(env, pipeline.dead.identifier)  # the crashed batch's dead letters are still to be added

    applied = _json(env.cli("reset", "--from-table", "--reason", "dead letters expired", "--json"))
    again = _json(env.cli("reset", "--from-table", "--reason", "dead letters expired", "--json"))

    assert (applied["status"], applied["recovered"]) == ("applied", False)
    assert {b for _, b in _offsets(applied).values()} == {"ledger"}
    assert pipeline.ledger() == rows_ledger  # the rows ledger is intact and was not moved
    floor = {p["partition"]: p["floor"] for p in applied["dead_letter_floor"]["offsets"]}
    assert all(floor[tp.partition] >= offset for tp, offset in rows_ledger.ledger.offsets.items())
    assert (again["status"], again["snapshot_id"]) == ("already-applied", applied["snapshot_id"])
    assert env.cli("run", "--until-caught-up").returncode == 0
    _assert_exactly_once(env)


def test_partitions_with_no_record_in_the_tables_resume_at_their_low_watermark(make_env: MakeEnv) -> None:
    env = make_env(partitions=4)
    env.produce(2)  # one record each in partitions 0 and 1
    assert env.cli("run").returncode == 0
    env.produce(4)  # partitions 2 and 3 get their first records; nothing of them is ingested yet
    pipeline = open_pipeline(env.config)
    _lose_ledger(pipeline.rows)
    _fails_closed(env, pipeline.rows.identifier)

    shown = env.cli("reset", "--from-table", "--reason", "rebuild")
    again = _json(env.cli("reset", "--from-table", "--reason", "rebuild", "--json"))

    assert shown.returncode == 0, shown.stderr
    unseen = [line for line in shown.stdout.splitlines() if "no record in the table" in line]
    assert [line.split(":")[0].strip() for line in unseen] == [f"{env.topic}[2]", f"{env.topic}[3]"]
    assert again["status"] == "already-applied"
    status = json.loads(env.cli("status", "--json").stdout)
    assert [p["committed"] for p in status["partitions"]] == [1, 1, 0, 0]
    pipeline.dead.refresh()
    assert pipeline.dead.table.metadata.snapshots == []  # never had a ledger: left alone
    assert env.cli("run", "--until-caught-up").returncode == 0
    _assert_exactly_once(env)


def test_to_offsets_over_a_lost_ledger_must_name_every_partition(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(200, bad_every=10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    pipeline = open_pipeline(env.config)
    before = head_ledger(pipeline).ledger.offsets
    _lose_ledger(pipeline.rows)
    _fails_closed(env, pipeline.rows.identifier)
    p0, p1 = sorted(before)

    partial = env.cli("reset", "--to-offsets", f"{env.topic}:0={before[p0]}", "--reason", "INC-9")
    full = env.cli(
        "reset", "--to-offsets", f"{env.topic}:0={before[p0]},{env.topic}:1={before[p1]}", "--reason", "INC-9", "--json"
    )

    assert partial.returncode == ExitCode.CONFIG and "must name every partition" in partial.stderr
    applied = _json(full)
    assert (applied["status"], applied["recovered"], applied["dead_letter_ledger_lost"]) == ("applied", True, False)
    assert [(p["from"], p["to"]) for p in applied["offsets"]] == [(None, before[p0]), (None, before[p1])]
    nothing_lost = _json(env.cli("reset", "--from-table", "--reason", "INC-9", "--json"))
    assert (nothing_lost["status"], nothing_lost["snapshot_id"]) == ("not-needed", applied["snapshot_id"])
    env.produce(100, bad_every=10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    _assert_exactly_once(env)


@pytest.mark.parametrize(
    "kafka_now", [pytest.param("retention-passed-the-table", marks=needs_apache_kafka), "topic-recreated"]
)
def test_from_table_refuses_offsets_kafka_does_not_hold_and_changes_nothing(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch, kafka_now: str
) -> None:
    """Retention is real: Kafka deletes records past the newest row (DeleteRecords). The recreated
    topic holding 3 records is Kafka's answer injected at the adapter."""
    env = make_env(partitions=2)
    env.produce(200, bad_every=10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    pipeline = open_pipeline(env.config)
    _lose_ledger(pipeline.rows)
    _lose_ledger(pipeline.dead)
    real = type(pipeline.source).describe(pipeline.source)
    tp = min(real.partitions)
    if kafka_now == "retention-passed-the-table":
        env.produce(40)  # offsets 100..119 of each partition, never read
        env.delete_records({tp.partition: 106})  # past the newest row (offset 99)
    else:
        view = KafkaView(real.cluster_id, {**real.partitions, tp: Watermarks(0, 3)})
        monkeypatch.setattr(pipeline.source, "describe", lambda: view)
    before = _snapshot_counts(pipeline)

    with pytest.raises(FatalError) as caught:
        reset(pipeline, ResetTarget("table"), "rebuild")

    message = str(caught.value)
    if kafka_now == "topic-recreated":
        assert isinstance(caught.value, TopicRecreated)
        assert f"{tp} offset 99, but the partition ends at 3" in message and "recreated" in message
    else:
        assert f"{tp} offset 100 (retained [106, 120])" in message
        assert f"ingest reset --to-offsets {env.topic}:0=106,{env.topic}:1=99" in message
    assert _snapshot_counts(pipeline) == before
