"""Crash safety of the Spark driver with real processes: SIGKILL it at every step of a batch and at
random moments, rerun it with spark-submit, and nothing is lost or doubled. Local and Spark copies
of one pipeline racing on one table."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Env, MakeEnv

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import open_pipeline
from ingest.failpoints import POINTS
from tests.integration.conftest import REPO, Routed, contend
from tests.spark.conftest import KILLED_DRIVER, data_files_on_disk, spark_submit, spark_submit_command

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.spark]


def _snapshots(env: Env) -> tuple[int, int]:
    pipeline = open_pipeline(env.config)
    return len(pipeline.rows.table.metadata.snapshots), len(pipeline.dead.table.metadata.snapshots)


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
def test_driver_killed_at_each_step_then_rerun(
    make_env: MakeEnv, spark_process_env: dict[str, str], point: str
) -> None:
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
    # what a reader sees right after the crash: the rows commit decides, the dead letters follow
    assert _snapshots(env) == (int(point in ("between-commits", "after-commit")), int(point == "after-commit"))
    on_disk = data_files_on_disk(env)
    if point == "before-read":
        assert on_disk == 0
    elif point != "mid-read":
        assert on_disk > 0  # tasks had written files: orphans unless this batch committed

    rerun = spark_submit(env, "--until-caught-up", "--json")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    env.exact()


def _committed(env: Env) -> int:
    """Offsets the rows table's ledger has passed, summed over partitions (0: none yet)."""
    found = open_pipeline(env.config).ledger()
    return sum(found.ledger.offsets.values()) if found is not None else 0


def _batch_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The driver's next ``--json`` batch line (its stdout also carries the Python driver's stderr)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"the driver ended (exit {process.wait()}) before its next batch line")


def test_driver_killed_at_random_moments(make_env: MakeEnv) -> None:
    """Three spark-submit runs, each killed whole (spark-submit's JVM and the Python driver, as a
    container kill would) at a random moment within a batch's time after its second batch line:
    past the JVM's start and the first job's, while a later batch reads, writes or commits. Each
    run is shown to have committed something, to have had more to do, and to have been killed,
    not to have finished."""
    env = make_env(batch={"max_records": 700, "chunk_records": 300})
    rng = random.Random(20261203)
    for kill in range(3):
        env.produce(3_500, bad_every=13)  # five batches or more: the kill lands in the third or later
        before = _committed(env)
        process = subprocess.Popen(
            spark_submit_command(env, "--until-caught-up", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        try:
            _batch_line(process)  # the first, with the JVM's start and the first job's in it
            second = _batch_line(process)
            time.sleep(rng.uniform(0.0, max(0.05, second["seconds"])))
        finally:
            with contextlib.suppress(ProcessLookupError):  # (the group is gone only if the run ended and was reaped)
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            assert process.stdout is not None
            process.stdout.close()
        assert process.returncode == -signal.SIGKILL, f"kill {kill}: the run ended before it ({process.returncode})"
        assert before < _committed(env) < env.produced, f"kill {kill} did not land mid-run"
    final = spark_submit(env, "--until-caught-up")
    assert final.returncode == 0, final.stderr[-3000:]
    env.exact()


@pytest.mark.catalog_race
def test_local_and_spark_copies_racing_on_one_table(make_env: MakeEnv, spark_process_env: dict[str, str]) -> None:
    env = make_env(batch={"max_records": 500})
    env.produce(6_000, bad_every=17)
    run = [sys.executable, "-m", "ingest", "run", "--until-caught-up", "--json", "-c", str(env.config_path)]

    # every copy either finishes or stops with a retryable error (fenced too often, catalog busy); the
    # local copy's first batch waits until a Spark copy has committed, and meets its commit
    contend(
        [
            (run, None),
            (spark_submit_command(env, "--until-caught-up", "--json"), None),
            ([*run, "--engine", "spark"], spark_process_env),
        ]
    )

    final = env.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    env.exact()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_spark_submit_of_a_config_of_two_tables_then_killed_between_them(routed: Routed) -> None:
    routed.produce("a1", 1_500, bad_every=11)
    routed.produce("a2", 900, bad_every=13)
    routed.produce("b", 1_100, bad_every=7)

    # killed right after the first table's batch committed: the second table's has not begun
    killed = spark_submit(routed.env, extra_env={"INGEST_FAILPOINT": "after-commit#1"}, config=routed.path)
    assert killed.returncode == KILLED_DRIVER, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert routed.counts(routed.tables[0])[0] > 0 and routed.counts(routed.tables[1]) == (0, 0)
    routed.produce("a2", 300)  # the first table has a batch to run again too

    rerun = spark_submit(routed.env, "--until-caught-up", "--json", config=routed.path)

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    tables = {json.loads(line)["table"] for line in rerun.stdout.splitlines() if line.startswith("{")}
    assert tables == set(routed.tables)
    # one Spark context for both tables (each table's engine would otherwise start and stop its own)
    assert len(re.findall(r"SparkContext: Running Spark version", rerun.stderr)) == 1
    routed.exact()
