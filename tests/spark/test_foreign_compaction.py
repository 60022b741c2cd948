"""The pipeline survives a real foreign compaction: Iceberg's own Spark runtime rewriting and expiring.

The foreign writer is ``CALL <catalog>.system.rewrite_data_files`` / ``expire_snapshots`` in a
spark-submit JVM of its own, through Iceberg's JDBC catalog on the PostgreSQL catalog that the
pipeline writes with pyiceberg (see ``iceberg_jvm.py``). Its snapshots know nothing of our ledger:
the lookup must walk past them, a commit racing them must notice the moved head and land once, and
an expiry that removes every ledger-bearing snapshot must stop the pipeline rather than let it
re-read from the start.

PostgreSQL only: a JVM must not write the SQLite file that pyiceberg writes (they lock each other).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.iceberg.files import live_data_files, live_files, stored_data_files
from ingest.iceberg.reading import all_snapshots
from ingest.progress import Advanced
from tests.integration.conftest import MakeEnv
from tests.runs import catch_up

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import Opened, open_pipeline
from ingest.batch_result import BatchResult
from ingest.core.ledger_codec import decode
from ingest.core.plan import Batch
from ingest.engines.local import LocalEngine
from ingest.errors import CommitConflict, ExitCode
from ingest.intents import RefIntent, SnapshotIntent
from ingest.ports import Produced
from ingest.records import Declared
from tests.integration.conftest import Env
from tests.spark.iceberg_jvm import call, iceberg_jars_fixture, jdbc_catalog  # noqa: F401  (fixture iceberg_jars)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.parametrize("catalog_kind", ["postgres"]),  # a JVM writer needs a server catalog
]

OFFSETS = "ingest.orders.offsets"


def _rewrite(env: Env) -> str:
    """Spark's bin-pack compaction, made to rewrite every small file (this table has no big ones)."""
    return (
        f"CALL {env.config.catalog['name']}.system.rewrite_data_files(table => '{env.config.table}', "
        "options => map('min-input-files', '2', 'rewrite-all', 'true'))"
    )


def _spark(env: Env, jars: list[Path], *statements: str) -> list[list[dict[str, Any]]]:
    return call(jars, jdbc_catalog(env.config.catalog), *statements)


def _catch_up(pipeline: Opened) -> list[BatchResult]:
    results = list(catch_up(pipeline))
    assert results and all(r.status == "committed" for r in results), results
    return results


def _snapshots(pipeline: Opened) -> list[Any]:
    """The rows table's snapshots, oldest first (pyiceberg ``Snapshot`` objects)."""
    pipeline.rows.refresh()
    return list(pipeline.rows.table.metadata.snapshots)


def _distinct(table: pa.Table) -> int:
    return int(table.group_by(table.column_names).aggregate([]).num_rows)


def _assert_exactly_once(env: Env, pipeline: Opened) -> None:
    """Every produced record is a row or a dead letter, once; ``ingest verify`` agrees."""
    pipeline.rows.refresh()
    pipeline.dead.refresh()
    rows = pipeline.rows.scan_columns(["_kafka_topic", "_kafka_partition", "_kafka_offset"])
    dead = pipeline.dead.scan_columns(["topic", "partition", "offset"])
    assert (rows.num_rows, dead.num_rows) == (env.produced - env.bad, env.bad)
    assert (_distinct(rows), _distinct(dead)) == (rows.num_rows, dead.num_rows)  # no Kafka coordinate twice
    env.verify()


def test_ingestion_continues_after_spark_rewrite_data_files(make_env: MakeEnv, iceberg_jars: list[Path]) -> None:
    env = make_env(batch={"max_records": 150})
    env.produce(600, bad_every=13)
    pipeline = open_pipeline(env.config)
    _catch_up(pipeline)
    before = pipeline.ledger()
    assert before is not None
    small = len(live_data_files(pipeline.rows))

    [[rewritten]] = _spark(env, iceberg_jars, _rewrite(env))

    *ours, replace = _snapshots(pipeline)
    assert replace.summary.operation.value == "replace"
    assert not [key for key in replace.summary.additional_properties if key.startswith("ingest.")]
    assert replace.parent_snapshot_id == before.snapshot_id == ours[-1].snapshot_id
    assert rewritten["rewritten_data_files_count"] == small
    assert len(live_data_files(pipeline.rows)) == rewritten["added_data_files_count"] < small
    assert pipeline.ledger() == before  # found below the foreign snapshot
    assert env.counts() == (600 - env.bad, env.bad)

    env.produce(400, bad_every=13)
    after = _catch_up(pipeline)

    found = pipeline.ledger()
    assert found is not None and found.ledger.batch == before.ledger.batch + len(after)
    following = next(s for s in _snapshots(pipeline) if s.parent_snapshot_id == replace.snapshot_id)
    resumed = decode("orders", following.summary.additional_properties)
    assert resumed is not None and resumed.batch == before.ledger.batch + 1
    assert resumed.start_offsets == before.ledger.offsets  # resumed where the ledger below Spark's snapshot said
    _assert_exactly_once(env, pipeline)


def test_spark_compaction_between_plan_and_commit_lands_once(make_env: MakeEnv, iceberg_jars: list[Path]) -> None:
    env = make_env(batch={"max_records": 200})
    env.produce(600, bad_every=13)
    pipeline = open_pipeline(env.config)
    _catch_up(pipeline)
    before = pipeline.ledger()
    assert before is not None
    small = len(live_data_files(pipeline.rows))
    env.produce(300, bad_every=13)
    rewrites: list[dict[str, Any]] = []
    pending: list[Produced] = []

    class SparkCompactsMidBatch(LocalEngine):
        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)  # files written, nothing committed yet
            if not rewrites:
                [[rewritten]] = _spark(env, iceberg_jars, _rewrite(env))
                rewrites.append(rewritten)
                pending.append(produced)
            return produced

    attempts: list[str] = []
    real = pipeline.rows.commit

    def recorded(intent: SnapshotIntent | RefIntent) -> int | None:
        try:
            snapshot_id = real(intent)
        except CommitConflict:
            attempts.append("conflict")
            raise
        attempts.append("committed")
        return snapshot_id

    pipeline.rows.commit = recorded  # type: ignore[method-assign, assignment]

    result = pipeline.run_batch(SparkCompactsMidBatch(pipeline.config, pipeline.rows))

    assert (result.status, result.batch) == ("committed", before.ledger.batch + 1)
    assert attempts == ["conflict", "committed"]  # the moved head was noticed, the ledger re-observed
    [rewritten], [produced] = rewrites, pending
    assert rewritten["rewritten_data_files_count"] == small  # only committed files: ours were pending
    *_, replace, mine = _snapshots(pipeline)
    assert replace.summary.operation.value == "replace" and OFFSETS not in replace.summary.additional_properties
    assert (replace.parent_snapshot_id, mine.parent_snapshot_id) == (before.snapshot_id, replace.snapshot_id)
    assert mine.snapshot_id == result.snapshot_id
    landed = decode("orders", mine.summary.additional_properties)
    assert landed is not None and landed.start_offsets == before.ledger.offsets
    # the append went onto Spark's head: compacted files plus this batch's, no resurrected small files
    assert len(live_data_files(pipeline.rows)) == rewritten["added_data_files_count"] + len(produced.files)

    _catch_up(pipeline)
    _assert_exactly_once(env, pipeline)


def test_spark_expiry_of_every_ledger_fails_closed_then_from_table_recovers(
    make_env: MakeEnv, iceberg_jars: list[Path]
) -> None:
    env = make_env(batch={"max_records": 200})
    env.produce(400, bad_every=13)
    pipeline = open_pipeline(env.config)
    _catch_up(pipeline)
    ours = _snapshots(pipeline)
    newest = datetime.fromtimestamp(max(s.timestamp_ms for s in ours) / 1000, tz=UTC)
    cutoff = (newest + timedelta(milliseconds=1)).isoformat(timespec="milliseconds")
    expire = (
        f"CALL {env.config.catalog['name']}.system.expire_snapshots(table => '{env.config.table}', "
        f"older_than => TIMESTAMP '{cutoff}', retain_last => 1)"
    )

    [[rewritten], [expired]] = _spark(env, iceberg_jars, _rewrite(env), expire)

    [replace] = _snapshots(pipeline)  # every snapshot carrying the ledger is gone
    assert replace.summary.operation.value == "replace" and OFFSETS not in replace.summary.additional_properties
    assert replace.parent_snapshot_id == ours[-1].snapshot_id  # a dangling link to an expired snapshot
    assert expired["deleted_data_files_count"] == rewritten["rewritten_data_files_count"]
    state, counts = _written(pipeline), env.counts()
    assert counts == (400 - env.bad, env.bad)  # Spark kept every row
    env.produce(100, bad_every=13)  # new data: a pipeline that started over would write it (and re-read the rest)

    result = env.cli("run", "--json")

    assert result.returncode == ExitCode.FATAL, (result.stdout, result.stderr)
    error = json.loads(result.stdout.splitlines()[0])
    assert (error["type"], error["kind"]) == ("LedgerLost", "fatal")
    assert error["error"].startswith("ledger lost") and "'ingest.pipelines'" in error["error"]
    assert _written(pipeline) == state  # nothing was written: no snapshot, no data file, in either table
    assert env.counts() == counts
    assert "--from-table" in error["error"]

    # the fix the message names: rebuild the ledger from the Kafka coordinates Spark kept, then resume
    recovered = env.cli("reset", "--from-table", "--reason", "Spark expired every ledger", "--json")
    assert recovered.returncode == 0, (recovered.stdout, recovered.stderr)
    assert json.loads(recovered.stdout.splitlines()[0])["status"] == "applied"
    resumed = env.cli("run", "--until-caught-up")
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    _assert_exactly_once(env, pipeline)


def _written(pipeline: Opened) -> tuple[object, ...]:
    """Everything a run could have written: snapshots and stored files of both tables."""
    pipeline.rows.refresh()
    pipeline.dead.refresh()
    return tuple(
        (sorted(s.snapshot_id for s in all_snapshots(table)), sorted(path for path, _ in stored_data_files(table)))
        for table in (pipeline.rows, pipeline.dead)
    )


def test_maintain_compacts_a_table_with_foreign_position_deletes_applying_them(
    make_env: MakeEnv, iceberg_jars: list[Path]
) -> None:
    """A merge-on-read writer's DELETE (Spark's position delete files): ``ingest maintain`` rewrites
    the files they apply to with their live rows, so the deleted rows stay deleted, through
    pyiceberg and through Spark, and the runs go on."""
    env = make_env(batch={"max_records": 150})
    env.produce(600, bad_every=13)
    pipeline = open_pipeline(env.config)
    _catch_up(pipeline)
    table = f"{env.config.catalog['name']}.{env.config.table}"
    _spark(  # a merge-on-read writer: its DELETE writes position-delete files, no data file is rewritten
        env,
        iceberg_jars,
        f"ALTER TABLE {table} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read')",
        f"DELETE FROM {table} WHERE _kafka_offset < 10",
    )
    pipeline.rows.refresh()
    _, deletes = live_files(pipeline.rows)
    remaining = pipeline.rows.scan_columns(["_kafka_offset"]).num_rows
    assert deletes > 0 and remaining < 600 - env.bad

    result = env.cli("maintain", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["table"]
    assert report["files_removed"] > 0 and "skipped_delete_files" not in report
    pipeline.rows.refresh()
    assert pipeline.rows.scan_columns(["_kafka_offset"]).num_rows == remaining  # the deleted rows stay deleted
    [counted] = _spark(env, iceberg_jars, f"SELECT count(*) AS n FROM {table}")
    assert counted == [{"n": remaining}]
    env.produce(100)
    _catch_up(pipeline)
    assert pipeline.rows.scan_columns(["_kafka_offset"]).num_rows == remaining + 100
