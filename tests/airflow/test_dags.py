"""The example DAG file as the DAG processor parses it: one DAG per pipeline config, the schedule, the retries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.integration.conftest import REPO

from .conftest import DAG_FILE, NEEDS_AIRFLOW, NEEDS_PROVIDER

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

    from ingest.airflow import FreshnessCheckOperator

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
        assert _cron(dag) == "*/5 * * * *"
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


def _cron(dag: Any) -> str:
    from airflow.sdk import CronTriggerTimetable

    assert isinstance(dag.timetable, CronTriggerTimetable), dag.timetable
    return str(dag.timetable.expression)


def _freshness(dag: Any) -> FreshnessCheckOperator:
    from ingest.airflow import FreshnessCheckOperator

    task = dag.task_dict["freshness"]
    assert isinstance(task, FreshnessCheckOperator)
    return task


def _config(folder: Path, name: str, airflow: object = None) -> Path:
    """``conf/orders.yaml`` as ``<folder>/<name>.yaml``, with ``airflow`` as its ``airflow:`` block."""
    data = yaml.safe_load((REPO / "conf" / "orders.yaml").read_text())
    if airflow is not None:
        data["airflow"] = airflow
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_configs_airflow_block_shapes_its_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(tmp_path, "orders")
    _config(
        tmp_path,
        "payments",
        {
            "schedule": "@hourly",
            "start_date": "2025-06-01",
            "retries": 1,
            "retry_delay": "2m",
            "execution_timeout": "20m",
            "max_staleness": "3h",
            "tags": ["sales"],
            "pool": "kafka",
        },
    )
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))

    dags = _bag().dags
    orders, payments = dags["ingest_orders"], dags["ingest_payments"]

    # no block: today's values
    assert _cron(orders) == "*/5 * * * *"
    assert orders.start_date == datetime(2026, 1, 1, tzinfo=UTC)
    assert orders.tags == {"lakehouse-ingest"}
    ingest = orders.task_dict["ingest"]
    assert (ingest.retries, ingest.retry_delay, ingest.execution_timeout) == (
        4,
        timedelta(seconds=30),
        timedelta(hours=1),
    )
    assert ingest.pool == "default_pool"
    assert _freshness(orders).max_staleness == timedelta(minutes=30)
    # its own
    assert _cron(payments) == "0 * * * *"  # @hourly
    assert payments.start_date == datetime(2025, 6, 1, tzinfo=UTC)
    assert payments.tags == {"lakehouse-ingest", "sales"}
    ingest = payments.task_dict["ingest"]
    assert (ingest.retries, ingest.retry_delay, ingest.execution_timeout) == (
        1,
        timedelta(minutes=2),
        timedelta(minutes=20),
    )
    assert ingest.pool == "kafka"
    assert _freshness(payments).max_staleness == timedelta(hours=3)
    assert payments.catchup is False and payments.max_active_runs == 1


def test_a_config_whose_airflow_block_is_wrong_keeps_its_dag_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest.config import load
    from ingest.errors import ConfigError

    _config(tmp_path, "orders")
    wrong = _config(tmp_path, "payments", {"retries": -1, "colour": "blue"})
    _config(tmp_path, "refunds", {"schedule": "every tuesday"})
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))

    dags = _bag().dags  # no import error: the folder's other DAGs are not hidden

    assert sorted(dags) == ["ingest_orders", "ingest_payments", "ingest_refunds"]
    assert "invalid-config" not in dags["ingest_orders"].tags
    for dag_id, why in (("ingest_payments", "airflow.retries"), ("ingest_refunds", "every tuesday")):
        dag = dags[dag_id]
        assert "invalid-config" in dag.tags and why in str(dag.description), dag.description
        assert _cron(dag) == "*/5 * * * *"  # the defaults
    assert "airflow.colour" in str(dags["ingest_payments"].description)
    with pytest.raises(ConfigError, match=r"airflow\.retries"):  # and the task fails, saying so
        load(wrong)


def test_parsing_the_dag_file_reads_no_variable_and_touches_no_database(tmp_path: Path) -> None:
    """Airflow's best practices: top-level code of a DAG file reads no Variable (each read is a
    query of the metadata database, at every parse). With no Variable set, the example DAG file
    parses from the configs alone; the database it is given is never opened."""
    database = tmp_path / "never.db"
    code = f"""
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag

read = []
for kind in (airflow.sdk.Variable, airflow.sdk.Connection):
    def recorded(*args, _real=kind.get, _kind=kind.__name__, **kwargs):
        read.append((_kind, args[:1]))
        return _real(*args, **kwargs)
    kind.get = recorded
bag = DagBag(dag_folder={str(DAG_FILE)!r})
assert not bag.import_errors, bag.import_errors
assert not read, f"read at parse time: {{read}}"
print(sorted(bag.dags))
"""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_VAR_")}
    environment |= {
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}",
    }
    parsed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300, env=environment
    )

    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert "'ingest_orders'" in parsed.stdout
    assert not database.exists()


def test_spark_engine_submits_the_spark_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow.providers.apache.spark", reason=NEEDS_PROVIDER)
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from ingest.airflow import SparkExitCodePolicy

    _config(tmp_path, "orders", {"engine": "spark"})
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))

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
