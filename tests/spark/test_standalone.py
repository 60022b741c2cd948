"""The Spark engine beyond ``local[2]``: a standalone master and two workers started by the test, and
``spark-submit --master spark://… jobs/spark_ingest.py`` against the real broker.

Executors are JVMs of their own on the workers, with their own Python workers, so what a task
needs crosses real process boundaries (the task spec, the detached table). The driver is killed
mid-batch twice (once by its own failpoint after some executors wrote their files, once with the
whole spark-submit process group at a moment between batches or inside one) and rerun: exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.conftest import MakeEnv

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import open_pipeline
from tests import strict
from tests.integration.conftest import REPO
from tests.services.spark_standalone import SparkStandalone, SparkUnavailable
from tests.spark.conftest import KILLED_DRIVER, data_files_on_disk, spark_submit, spark_submit_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.crash,
    pytest.mark.spark,
    pytest.mark.parametrize("catalog_kind", ["postgres"]),  # executors on other JVMs share a server catalog
]

#: executors of one core each, one per worker; the Python workers run this interpreter
EXECUTORS = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "768m",
    "spark.cores.max": "2",
    "spark.pyspark.python": sys.executable,
    "spark.task.maxFailures": "2",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    try:
        with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), workers=2) as started:
            yield started
    except SparkUnavailable as error:
        strict.missing(f"no Spark standalone cluster here: {error}")


def _executor_logs(cluster: SparkStandalone) -> dict[str, int]:
    """Per worker, how many executors it has run (``work-dir/app-*/N/``)."""
    return {d.name: sum(1 for _ in d.glob("app-*/*/stderr")) for d in cluster.worker_dirs()}


def test_spark_submit_on_a_standalone_cluster_killed_mid_batch_and_rerun(
    make_env: MakeEnv, cluster: SparkStandalone
) -> None:
    env = make_env(partitions=4, batch={"max_records": 2_000, "read_timeout_s": 30})
    env.produce(12_000, bad_every=19)
    before = _executor_logs(cluster)

    # 1. the driver kills itself once some executors have written their files and others have not
    killed = spark_submit(
        env, "--until-caught-up", master=cluster.url, conf=EXECUTORS, extra_env={"INGEST_FAILPOINT": "mid-write"}
    )
    assert killed.returncode == KILLED_DRIVER, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert env.counts() == (0, 0)  # nothing committed by the killed batch
    assert data_files_on_disk(env) > 0  # but files written by the executors done by then
    cluster.wait_idle()

    # 2. the whole spark-submit process group, killed right after a batch committed (the next is starting)
    process = subprocess.Popen(
        spark_submit_command(env, "--until-caught-up", "--json", master=cluster.url, conf=EXECUTORS),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    assert process.stdout is not None
    first = json.loads(process.stdout.readline())
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    assert process.returncode == -signal.SIGKILL  # killed, not ended by itself
    assert first["status"] == "committed" and first["records"] + first["dead_letters"] == 2_000
    cluster.wait_idle()

    rerun = spark_submit(env, "--until-caught-up", "--json", master=cluster.url, conf=EXECUTORS)

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    batches = [json.loads(line) for line in rerun.stdout.splitlines()]
    assert batches[0]["batch"] == 2  # resumed after the batch the killed driver committed
    env.exact()
    # the tasks ran in executors on both workers, not in the driver
    after = _executor_logs(cluster)
    assert all(after[name] > before[name] for name in after), (before, after)
    ledger = open_pipeline(env.config).ledger()
    assert ledger is not None and ledger.ledger.batch == len(batches) + 1
