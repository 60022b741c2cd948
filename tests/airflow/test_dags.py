"""The example DAG file as the DAG processor parses it: one DAG per pipeline config, the schedule, the retries."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.conftest import REPO

from .conftest import DAG_FILE, NEEDS_AIRFLOW, NEEDS_PROVIDER

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

pytestmark = pytest.mark.airflow
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)


def _bag() -> DagBag:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_one_dag_per_pipeline_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import CronTriggerTimetable

    from ingest.airflow import FreshnessCheckOperator, IngestOperator

    for name in ("orders", "payments"):
        shutil.copy(REPO / "conf" / "orders.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "notes.txt").write_text("not a pipeline")
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))

    bag = _bag()

    assert sorted(bag.dags) == ["ingest_orders", "ingest_payments"]
    for dag_id, dag in bag.dags.items():
        assert dag.fileloc == str(DAG_FILE)  # where a worker re-parses it
        assert isinstance(dag.timetable, CronTriggerTimetable)
        assert dag.timetable.expression == "*/5 * * * *"
        assert dag.catchup is False
        assert dag.max_active_runs == 1
        ingest, freshness = dag.task_dict["ingest"], dag.task_dict["freshness"]
        assert isinstance(ingest, IngestOperator) and isinstance(freshness, FreshnessCheckOperator)
        assert ingest.config_path == str(tmp_path / f"{dag_id.removeprefix('ingest_')}.yaml")
        assert ingest.downstream_task_ids == {"freshness"}
        assert ingest.retries is not None and ingest.retries >= 3
        assert ingest.retry_exponential_backoff > 1
        assert ingest.max_retry_delay == timedelta(minutes=5)
        assert freshness.trigger_rule == "all_done"  # checks even when ingest keeps failing
        assert freshness.max_staleness == timedelta(minutes=30)


def test_default_pipelines_folder_is_the_repos_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    from ingest.airflow import IngestOperator

    monkeypatch.delenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", raising=False)
    ingest = _bag().dags["ingest_orders"].task_dict["ingest"]
    assert isinstance(ingest, IngestOperator)
    assert ingest.config_path == str(REPO / "conf" / "orders.yaml")


def test_spark_engine_submits_the_spark_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow.providers.apache.spark", reason=NEEDS_PROVIDER)
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from ingest.airflow import SparkExitCodePolicy

    shutil.copy(REPO / "conf" / "orders.yaml", tmp_path / "orders.yaml")
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_ENGINE", "spark")

    ingest = _bag().dags["ingest_orders"].task_dict["ingest"]

    assert type(ingest).__name__ == "SparkSubmitOperator"
    assert isinstance(ingest, SparkSubmitOperator)
    assert ingest.application == str(REPO / "jobs" / "spark_ingest.py")
    assert ingest.application_args == ["-c", str(tmp_path / "orders.yaml"), "--until-caught-up"]
    assert isinstance(ingest.retry_policy, SparkExitCodePolicy)


def test_missing_extra_says_what_to_install() -> None:
    code = "import sys; sys.modules['airflow'] = None; import ingest.airflow"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 1
    assert "pip install 'lakehouse-ingest[airflow]'" in result.stderr
