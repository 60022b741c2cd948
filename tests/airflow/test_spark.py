"""The Spark path (``airflow: {engine: spark}``): SparkSubmitOperator submitting jobs/spark_ingest.py.

Real spark-submit (pyspark's, local mode) runs the real job with the Spark engine; the provider's
operator and hook report its exit code, and Airflow's retry decision follows it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from ingest.kafka.embedded import free_port
from tests.integration.conftest import Env, MakeEnv

from .conftest import NEEDS_AIRFLOW, NEEDS_PROVIDER, Airflow, quick_retries

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)
pytest.importorskip("airflow.providers.apache.spark", reason=NEEDS_PROVIDER)
pyspark = pytest.importorskip("pyspark", reason="pip install 'lakehouse-ingest[spark]'")


@pytest.fixture
def spark(airflow: Airflow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Airflow:
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.ui.enabled false\nspark.sql.shuffle.partitions 2\n")
    spark_bin = Path(pyspark.__file__).parent / "bin"
    monkeypatch.setenv("PATH", f"{spark_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return airflow


def on_spark(env: Env) -> Env:
    """The config's DAG runs the Spark job (its ``airflow:`` block)."""
    data = yaml.safe_load(env.config_path.read_text())
    env.config_path.write_text(yaml.safe_dump({**data, "airflow": {"engine": "spark"}}))
    return env


def test_spark_path_ingests_exactly_once(make_env: MakeEnv, spark: Airflow) -> None:
    env: Env = on_spark(make_env())
    env.produce(1_000, bad_every=9)
    outcome = spark.test(quick_retries(spark.dag(env), retries=0))
    assert outcome.state == "success", outcome.tasks
    assert env.counts() == (1_000 - env.bad, env.bad)
    env.verify()


@pytest.mark.parametrize(("breakage", "tries"), [("config", 1), ("catalog", 2)])
def test_spark_exit_code_decides_the_retry(
    make_env: MakeEnv, spark: Airflow, capfd: pytest.CaptureFixture[str], breakage: str, tries: int
) -> None:
    env: Env = on_spark(make_env())
    data = yaml.safe_load(env.config_path.read_text())
    if breakage == "config":  # exit 78: fatal
        data["topic"] = "typo"
    else:  # exit 75: retryable
        data["catalog"]["uri"] = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    env.config_path.write_text(yaml.safe_dump(data))

    outcome = spark.test(quick_retries(spark.dag(env)))

    assert outcome.state_of("ingest") == "failed"
    assert outcome.tries_of("ingest") == tries
    assert ("exited 78 (fatal" if breakage == "config" else "exited 75 (retryable") in capfd.readouterr().out


@pytest.mark.parametrize(
    ("code", "action"),
    [(75, "retry"), (65, "fail"), (78, "fail"), (2, "fail"), (1, "default"), (137, "default")],
)
def test_the_policy_reads_the_exit_code_from_the_providers_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, action: str
) -> None:
    """The provider's hook raises one exception type for every exit; the policy finds the code in its
    message (docs/usage.md: 75 retried, 65, 78 and a usage error not, anything else the task's retries)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from ingest.airflow import SparkExitCodePolicy

    stub = tmp_path / "spark-submit"
    stub.write_text(f"#!/bin/sh\nexit {code}\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

    with pytest.raises(Exception, match=f"Error code is: {code}") as failure:
        SparkSubmitHook(conn_id="spark_default").submit(str(tmp_path / "job.py"))
    decision = SparkExitCodePolicy().evaluate(failure.value, try_number=1, max_tries=5)

    assert decision.action.value == action
    if action != "default":
        assert f"exited {code}" in decision.reason
