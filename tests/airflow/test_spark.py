"""The Spark path (Variable ingest_engine=spark): SparkSubmitOperator submitting jobs/spark_ingest.py.

Real spark-submit (pyspark's, local mode) runs the real job with the Spark engine; the provider's
operator and hook report its exit code, and Airflow's retry decision follows it.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from ingest import cli
from ingest.kafka.embedded import free_port

from .conftest import NEEDS_AIRFLOW, Airflow, Env, quick_retries

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)
pytest.importorskip("airflow.providers.apache.spark", reason="pip install apache-airflow-providers-apache-spark")
pyspark = pytest.importorskip("pyspark", reason="pip install 'lakehouse-ingest[spark]'")
if "engine" not in inspect.signature(cli.run).parameters:
    pytest.skip("jobs/spark_ingest.py needs `ingest run --engine spark` (not in the CLI yet)", allow_module_level=True)


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
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_ENGINE", "spark")
    return airflow


def test_spark_path_ingests_exactly_once(make_env, spark: Airflow) -> None:
    env: Env = make_env()
    env.produce(1_000, bad_every=9)
    outcome = spark.test(quick_retries(spark.dag(env), retries=0))
    assert outcome.state == "success", outcome.tasks
    assert env.counts() == (1_000 - env.bad, env.bad)
    env.verify()


@pytest.mark.parametrize(("breakage", "tries"), [("config", 1), ("catalog", 2)])
def test_spark_exit_code_decides_the_retry(make_env, spark: Airflow, capfd, breakage: str, tries: int) -> None:
    env: Env = make_env()
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
