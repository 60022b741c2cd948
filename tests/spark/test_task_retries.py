"""Spark task attempts that fail after writing their files: retried without duplicates, or failing
the batch without a trace. Real spark-submit drivers in local mode, ``local[N,maxFailures]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Env, MakeEnv

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import open_pipeline
from ingest.engines.spark import TASK_FAILURE_ENV
from tests.spark.conftest import spark_submit

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def catalog_kind() -> str:
    """Task attempts do not touch the catalog (the driver commits): one catalog is enough here."""
    return "sqlite"


def _files(env: Env) -> tuple[set[str], set[str]]:
    """(data files the rows table references, Parquet files in its data directory)."""
    table = open_pipeline(env.config).rows.table
    committed = {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}
    location = table.location().removeprefix("file://")
    return committed, {str(p) for p in Path(location, "data").rglob("*.parquet")}


@pytest.mark.parametrize("failure", ["raise", "kill"])
def test_a_task_that_fails_once_is_retried_without_duplicates(make_env: MakeEnv, failure: str) -> None:
    env = make_env()
    env.produce(1_500, bad_every=11)

    result = spark_submit(
        env, "--until-caught-up", "--json", master="local[2,2]", extra_env={TASK_FAILURE_ENV: failure}
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Lost task" in result.stderr  # every task's first attempt failed and was retried
    assert env.counts() == (1_500 - env.bad, env.bad)
    env.verify()
    committed, on_disk = _files(env)
    assert committed < on_disk  # the failed attempts' files exist, and no snapshot references them


def test_a_task_that_fails_without_retries_fails_the_batch_and_leaves_no_trace(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(3_000, bad_every=11)

    failed = spark_submit(env, "--json", master="local[2]", extra_env={TASK_FAILURE_ENV: "raise"})

    assert failed.returncode == 1, failed.stderr[-3000:]  # not a domain error: internal, never retried blindly
    assert "injected failure" in failed.stderr
    pipeline = open_pipeline(env.config)
    assert (len(pipeline.rows.table.metadata.snapshots), len(pipeline.dead.table.metadata.snapshots)) == (0, 0)
    rerun = spark_submit(env, "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert env.counts() == (3_000 - env.bad, env.bad)
    env.verify()
