"""The example DAG file as the DAG processor parses it: one DAG per pipeline config, the schedule, the retries."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from .conftest import DAG_FILE, NEEDS_AIRFLOW, NEEDS_PROVIDER, REPO

pytestmark = pytest.mark.airflow
pytest.importorskip("airflow.sdk", reason=NEEDS_AIRFLOW)


def _bag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_one_dag_per_pipeline_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("orders", "payments"):
        shutil.copy(REPO / "conf" / "orders.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "notes.txt").write_text("not a pipeline")
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))

    bag = _bag()

    assert sorted(bag.dags) == ["ingest_orders", "ingest_payments"]
    for dag_id, dag in bag.dags.items():
        assert dag.fileloc == str(DAG_FILE)  # where a worker re-parses it
        assert dag.timetable.expression == "*/5 * * * *"
        assert dag.catchup is False
        assert dag.max_active_runs == 1
        ingest, freshness = dag.task_dict["ingest"], dag.task_dict["freshness"]
        assert ingest.config_path == str(tmp_path / f"{dag_id.removeprefix('ingest_')}.yaml")
        assert ingest.downstream_task_ids == {"freshness"}
        assert ingest.retries >= 3
        assert ingest.retry_exponential_backoff > 1
        assert ingest.max_retry_delay == timedelta(minutes=5)
        assert freshness.trigger_rule == "all_done"  # checks even when ingest keeps failing
        assert freshness.max_staleness == timedelta(minutes=30)


def test_default_pipelines_folder_is_the_repos_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", raising=False)
    dag = _bag().dags["ingest_orders"]
    assert dag.task_dict["ingest"].config_path == str(REPO / "conf" / "orders.yaml")


def test_spark_engine_submits_the_spark_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow.providers.apache.spark", reason=NEEDS_PROVIDER)
    from ingest.airflow import SparkExitCodePolicy

    shutil.copy(REPO / "conf" / "orders.yaml", tmp_path / "orders.yaml")
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_ENGINE", "spark")

    ingest = _bag().dags["ingest_orders"].task_dict["ingest"]

    assert type(ingest).__name__ == "SparkSubmitOperator"
    assert ingest.application == str(REPO / "jobs" / "spark_ingest.py")
    assert ingest.application_args == ["-c", str(tmp_path / "orders.yaml"), "--until-caught-up"]
    assert isinstance(ingest.retry_policy, SparkExitCodePolicy)


def test_missing_extra_says_what_to_install() -> None:
    code = "import sys; sys.modules['airflow'] = None; import ingest.airflow"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 1
    assert "pip install 'lakehouse-ingest[airflow]'" in result.stderr
