"""`ingest maintain` keeps the ledger: compaction, expiry and orphan removal around ingestion."""

from __future__ import annotations

import json
import signal
import time

import pyarrow as pa
import pytest

from ingest.assembly import Opened, open_pipeline
from ingest.config import MaintenanceSpec
from ingest.iceberg.files import live_data_files, live_files, referenced_paths, stored_data_files
from ingest.iceberg.layout import open_table
from ingest.iceberg.schema import rows_schema
from ingest.iceberg.table import IcebergTable
from ingest.intents import Append, RefIntent, Rewrite, RowDelta, SnapshotIntent
from ingest.ops.maintain import Compaction, compact, expire, maintain, remove_orphans
from tests.integration.conftest import Env, MakeEnv
from tests.integration.test_table_contract import KEY, key_rows, rows
from tests.runs import head_ledger, one_batch

pytestmark = [
    pytest.mark.integration,
    # every test on the local disk (two catalogs) and on S3
    pytest.mark.parametrize(
        "catalog_kind", ["sqlite", "postgres", "sqlite+s3", "rest", "rest+s3", "glue+s3"], indirect=True
    ),
]

AGGRESSIVE = {"snapshot_retention_hours": 0, "keep_last_snapshots": 1, "orphan_age_hours": 1}


def _batches(env: Env, pipeline: Opened, count: int, size: int = 200) -> None:
    for _ in range(count):
        env.produce(size, bad_every=40)
        one_batch(pipeline)


def test_compaction_rewrites_small_files_and_keeps_the_ledger(make_env: MakeEnv) -> None:
    env = make_env(partition_by=[])
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 6)
    before = pipeline.ledger()
    files_before = len(live_data_files(pipeline.rows))

    result = env.cli("maintain", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["table"]["files_removed"] == files_before and report["table"]["files_added"] == 1
    pipeline.rows.refresh()
    assert len(live_data_files(pipeline.rows)) == 1
    after = pipeline.ledger()
    assert after is not None and before is not None
    assert after.snapshot_id != before.snapshot_id  # the compaction snapshot carries the ledger
    assert after.ledger.offsets == before.ledger.offsets and after.ledger.batch == before.ledger.batch
    history = json.loads(env.cli("history", "--json").stdout)
    assert [h["batch"] for h in history] == [6, 5, 4, 3, 2, 1]
    env.verify()
    _batches(env, pipeline, 1)
    assert env.counts() == (1_400 - env.bad, env.bad)
    env.verify()


def test_compaction_concurrent_with_a_batch_restamps_the_new_ledger(make_env: MakeEnv) -> None:
    env = make_env(partition_by=[])
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 4)
    other = open_pipeline(env.config)
    table = pipeline.rows
    real = table.commit
    raced: list[bool] = []

    def batch_lands_first(intent: SnapshotIntent | RefIntent) -> int | None:
        if isinstance(intent, Rewrite) and not raced:
            raced.append(True)
            env.produce(300, bad_every=40)
            assert one_batch(other).status == "committed"  # a batch commits while compaction runs
        return real(intent)

    table.commit = batch_lands_first  # type: ignore[method-assign, assignment]
    result = compact(table, MaintenanceSpec())

    assert raced and result.files_removed == 4
    found = pipeline.ledger()
    assert found is not None and found.ledger.batch == 5  # not the stale ledger of batch 4
    assert env.counts() == (1_100 - env.bad, env.bad)
    env.verify()
    _batches(env, pipeline, 1)
    env.verify()


def test_expiry_keeps_the_ledger_reachable_below_foreign_snapshots(make_env: MakeEnv) -> None:
    env = make_env(maintenance=AGGRESSIVE)
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 5)
    table = pipeline.rows.table
    for _ in range(3):  # another writer's snapshots on top, without our ledger
        table.append(pa.Table.from_pylist([], schema=table.schema().as_arrow()))

    expired = expire(pipeline.rows, pipeline.config.maintenance, int(time.time() * 1000) + 1)

    assert len(expired) == 4  # batches 1-4 go; batch 5 and the foreign snapshots above it stay
    assert head_ledger(pipeline).ledger.batch == 5
    _batches(env, pipeline, 1)
    assert head_ledger(pipeline).ledger.batch == 6
    env.verify()


def test_orphans_of_a_crashed_batch_are_removed(make_env: MakeEnv) -> None:
    env = make_env(maintenance=AGGRESSIVE)
    env.produce(500, bad_every=40)
    killed = env.cli("run", env={"INGEST_FAILPOINT": "files-written"})
    assert killed.returncode == -signal.SIGKILL
    pipeline = open_pipeline(env.config)
    stored = stored_data_files(pipeline.rows)
    assert stored and referenced_paths(pipeline.rows) == set()

    removed = remove_orphans(pipeline.rows, pipeline.config.maintenance, time.time() + 3_601)

    assert sorted(removed) == sorted(path for path, _ in stored)
    assert env.cli("run").returncode == 0
    assert env.counts() == (500 - env.bad, env.bad)
    env.verify()


def test_maintain_a_day_later_removes_the_orphans_beside_live_files_and_only_them(make_env: MakeEnv) -> None:
    # on S3 the stored files' paths once came out as s3://lakelake/...: every live file looked unreferenced
    env = make_env()
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 2)
    live = referenced_paths(pipeline.rows)
    env.produce(300, bad_every=30)
    assert env.cli("run", env={"INGEST_FAILPOINT": "files-written"}).returncode == -signal.SIGKILL
    orphans = {path for path, _ in stored_data_files(pipeline.rows)} - live
    assert orphans and live <= {path for path, _ in stored_data_files(pipeline.rows)}

    report = maintain(pipeline, now=time.time() + 25 * 3600)  # past the default 24 h bound

    assert report.table.orphans_removed == len(orphans)
    stored = {path for path, _ in stored_data_files(pipeline.rows)}
    assert not orphans & stored and referenced_paths(pipeline.rows) <= stored  # compaction may add files
    assert env.cli("run").returncode == 0
    assert env.counts() == (env.produced - env.bad, env.bad)
    env.verify()


def test_maintain_on_a_young_table_removes_nothing_in_use(make_env: MakeEnv) -> None:
    env = make_env()
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 3)
    report = maintain(pipeline)
    assert report.table.orphans_removed == 0 and report.table.snapshots_expired == 0
    assert isinstance(pipeline.rows, IcebergTable)
    env.verify()


def test_compaction_applies_a_changelogs_position_deletes_and_removes_their_files(make_env: MakeEnv) -> None:
    """Rows a changelog's row deltas deleted by position: compaction rewrites the files they
    deleted from with their live rows (and the small file beside them), removes the delete files in
    the same snapshot, and the table reads the same."""
    rows_table = open_pipeline(make_env().config).rows
    catalog = rows_table.table.catalog
    name = f"{rows_table.identifier.rpartition('.')[0]}.changelog"
    table = open_table(catalog, name, rows_schema([]))
    table.refresh()
    table.commit(Append(table.write(rows(0, 5)), {}))
    table.commit(Append(table.write(rows(5, 10)), {}))
    table.commit(RowDelta(table.write(pa.concat_tables([rows(3, 4), rows(12, 13)])), KEY, key_rows(3, 7, 12), {}))
    table.commit(RowDelta([], KEY, key_rows(3, 8), {}))

    def offsets() -> list[int]:
        return sorted(catalog.load_table(name).scan().to_arrow()["_kafka_offset"].to_pylist())

    assert offsets() == [0, 1, 2, 4, 5, 6, 9, 12] and live_files(table)[1] == 4

    result = compact(table, MaintenanceSpec())

    assert (result.files_removed, result.files_added, result.delete_files_removed) == (3, 1, 4)
    assert offsets() == [0, 1, 2, 4, 5, 6, 9, 12]
    files, deletes = live_files(table)
    assert len(files) == 1 and deletes == 0
    head = catalog.load_table(name).current_snapshot()
    assert head is not None and head.summary is not None
    summary = head.summary
    assert summary.operation.value == "overwrite" and summary["ingest.maintenance"] == "compaction"
    assert summary["removed-delete-files"] == "4" and summary["total-delete-files"] == "0"
    assert summary["total-records"] == "8"
    assert compact(table, MaintenanceSpec()) == Compaction()  # nothing left to do


def test_a_row_delta_landing_while_a_changelog_table_compacts_keeps_its_deletes(make_env: MakeEnv) -> None:
    """A changelog batch deletes a row of a file compaction has read, before compaction commits:
    the compaction, whose new file still holds that row, must not land (it would bring it back)."""
    rows_table = open_pipeline(make_env().config).rows
    name = f"{rows_table.identifier.rpartition('.')[0]}.changelog"
    table = open_table(rows_table.table.catalog, name, rows_schema([]))
    table.refresh()
    table.commit(Append(table.write(rows(0, 5)), {}))
    table.commit(RowDelta([], KEY, key_rows(1), {}))
    other = open_table(rows_table.table.catalog, name, rows_schema([]))
    real = table.commit
    raced: list[bool] = []

    def a_row_delta_lands_first(intent: SnapshotIntent | RefIntent) -> int | None:
        if isinstance(intent, Rewrite) and not raced:
            raced.append(True)
            other.refresh()
            other.commit(RowDelta([], KEY, key_rows(3), {}))
        return real(intent)

    table.commit = a_row_delta_lands_first  # type: ignore[method-assign, assignment]
    compact(table, MaintenanceSpec())

    assert raced
    live = rows_table.table.catalog.load_table(name).scan().to_arrow()["_kafka_offset"].to_pylist()
    assert sorted(live) == [0, 2, 4]
