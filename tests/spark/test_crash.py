"""Crash safety of the Spark driver with real processes: SIGKILL it at every step of a batch and at
random moments, rerun it with spark-submit, and nothing is lost or doubled. Local and Spark copies
of one pipeline racing on one table."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.failpoints import POINTS
from ingest.pipeline import Pipeline
from tests.integration.conftest import REPO, Routed
from tests.spark.conftest import spark_submit, spark_submit_command

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.spark]


def _snapshots(env) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    pipeline = Pipeline.open(env.config)
    return len(pipeline.rows.table.metadata.snapshots), len(pipeline.dead.table.metadata.snapshots)


def _data_files_on_disk(env) -> int:  # type: ignore[no-untyped-def]
    """Parquet files under the rows table's data directory, committed or not."""
    location = Pipeline.open(env.config).rows.table.location().removeprefix("file://")
    return sum(1 for _ in Path(location, "data").rglob("*.parquet"))


def _wait_until_no_process_has(marker: str, timeout_s: float = 30.0) -> None:
    """The driver's JVM must not outlive the driver: wait for every process whose command line names it."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if marker.encode() in cmdline.read_bytes():
                    alive.append(cmdline.parent.name)
            except OSError:  # the process ended while we looked
                continue
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} of the killed driver are still running"
        time.sleep(0.1)


@pytest.mark.parametrize("point", POINTS)
def test_driver_killed_at_each_step_then_rerun(make_env, spark_process_env, point: str) -> None:
    env = make_env(batch={"max_records": 3_000, "read_timeout_s": 20})  # one batch: one Spark job per run
    env.produce(3_000, bad_every=11)
    marker = f"ingest-crash-{uuid.uuid4().hex[:10]}"

    killed = env.cli(
        "run",
        "--engine",
        "spark",
        env={**spark_process_env, "INGEST_FAILPOINT": point, "PYSPARK_SUBMIT_ARGS": f"--name {marker} pyspark-shell"},
    )

    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    _wait_until_no_process_has(marker)
    # what a reader sees right after the crash
    assert _snapshots(env) == (int(point in ("between-commits", "after-commit")), int(point == "after-commit"))
    on_disk = _data_files_on_disk(env)
    if point == "before-read":
        assert on_disk == 0
    elif point != "mid-read":
        assert on_disk > 0  # tasks had written files: orphans unless this batch committed

    rerun = spark_submit(env, "--until-caught-up", "--json")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert env.counts() == (3_000 - env.bad, env.bad)
    env.verify()


def test_driver_killed_at_random_moments(make_env) -> None:
    env = make_env(batch={"max_records": 700, "chunk_records": 300})
    env.produce(6_000, bad_every=13)
    rng = random.Random(20261203)
    for _ in range(3):
        # the whole driver (spark-submit's JVM and the Python driver), as a container kill would
        process = subprocess.Popen(
            spark_submit_command(env, "--until-caught-up"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
        )
        time.sleep(rng.uniform(4.0, 16.0))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    final = spark_submit(env, "--until-caught-up")
    assert final.returncode == 0, final.stderr[-3000:]
    assert env.counts() == (6_000 - env.bad, env.bad)
    env.verify()


@pytest.mark.catalog_race
def test_local_and_spark_copies_racing_on_one_table(make_env, spark_process_env) -> None:
    env = make_env(batch={"max_records": 500})
    env.produce(6_000, bad_every=17)
    processes = [
        subprocess.Popen(
            spark_submit_command(env, "--until-caught-up", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        ),
        env.popen("run", "--until-caught-up", "--json"),
        env.popen("run", "--engine", "spark", "--until-caught-up", "--json", env=spark_process_env),
    ]
    outcomes = [(*p.communicate(timeout=300), p.returncode) for p in processes]

    # every copy either finished or stopped with a retryable error (fenced too often, catalog busy)
    for _, stderr, code in outcomes:
        assert code in (0, 75), stderr[-3000:]
    statuses = [json.loads(line).get("status") for o in outcomes for line in o[0].splitlines() if line.startswith("{")]
    assert "committed" in statuses
    final = env.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    assert env.counts() == (6_000 - env.bad, env.bad)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_spark_submit_of_a_config_of_two_tables_then_killed_between_them(routed: Routed) -> None:
    routed.produce("a1", 1_500, bad_every=11)
    routed.produce("a2", 900, bad_every=13)
    routed.produce("b", 1_100, bad_every=7)

    # killed right after the first table's batch committed: the second table's has not begun
    killed = spark_submit(routed.env, extra_env={"INGEST_FAILPOINT": "after-commit#1"}, config=routed.path)
    assert killed.returncode != 0
    assert routed.counts(routed.tables[0])[0] > 0 and routed.counts(routed.tables[1]) == (0, 0)
    routed.produce("a2", 300)  # the first table has a batch to run again too

    rerun = spark_submit(routed.env, "--until-caught-up", "--json", config=routed.path)

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    tables = {json.loads(line)["table"] for line in rerun.stdout.splitlines() if line.startswith("{")}
    assert tables == set(routed.tables)
    # one Spark context for both tables (each table's engine would otherwise start and stop its own)
    assert len(re.findall(r"SparkContext: Running Spark version", rerun.stderr)) == 1
    routed.exact()
