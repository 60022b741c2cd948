"""Real Airflow 3 for the example DAG: a metadata DB in a temporary AIRFLOW_HOME, the broker, SQLite catalogs.

Airflow reads its configuration when it is first imported, so the environment is set when this
conftest is loaded, before any test module imports Airflow. The broker and the per-test pipeline
(`make_env`, `Env`) are the integration suite's fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (  # noqa: F401  (fixtures reused)
    REPO,
    Env,
    bootstrap,
    make_env,
    rest_local,
    rest_s3,
    routed,
    s3,
)

DAG_FOLDER = REPO / "jobs" / "airflow"
DAG_FILE = DAG_FOLDER / "ingest_dags.py"
AIRFLOW = str(Path(sys.executable).parent / "airflow")

_HOME = tempfile.mkdtemp(prefix="ingest-airflow-home-")
os.environ.update(
    {
        "AIRFLOW_HOME": _HOME,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
    }
)
#: every test module starts with this (a skip in a conftest would be a collection error)
NEEDS_AIRFLOW = "the Airflow tests need pip install 'lakehouse-ingest[airflow]'"
NEEDS_PROVIDER = "the Spark path needs pip install 'lakehouse-ingest[airflow-spark]'"


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture
def catalog_kind() -> str:
    """The Airflow tests use SQLite catalogs (the catalog protocol is covered on both by tests/integration)."""
    return "sqlite"


@pytest.fixture(scope="session")
def airflow_db() -> None:
    result = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@dataclass
class Outcome:
    """The task instances of one finished DAG run, as the scheduler would see them."""

    run_id: str
    state: str
    tasks: dict[str, tuple[str, int]]  # task_id -> (state, try_number)

    def state_of(self, task_id: str) -> str:
        return self.tasks[task_id][0]

    def tries_of(self, task_id: str) -> int:
        return self.tasks[task_id][1]


@dataclass
class Airflow:
    """The example DAG folder pointed at one test's pipelines folder."""

    folder: Path

    def dag(self, env: Env) -> Any:
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(DAG_FILE))
        assert not bag.import_errors, bag.import_errors
        return bag.dags[dag_id(env)]

    def test(self, dag: Any, **kwargs: Any) -> Outcome:
        """``dag.test()``: one DAG run in this process, against the metadata DB."""
        run = dag.test(**kwargs)
        return next(o for o in self.runs(run.dag_id) if o.run_id == run.run_id)

    def runs(self, dag_id: str) -> list[Outcome]:
        """Every run of the DAG in the metadata DB, whichever process ran it."""
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        outcomes = []
        with create_session() as session:
            for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)):
                tis = session.scalars(
                    select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run.run_id)
                )
                tasks = {ti.task_id: (str(ti.state), ti.try_number) for ti in tis}
                outcomes.append(Outcome(run.run_id, str(run.state), tasks))
        return outcomes

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        """The task's return value in that run, or None if it did not succeed."""
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            value = session.scalar(
                select(XComModel.value).where(
                    XComModel.dag_id == dag_id,
                    XComModel.run_id == run_id,
                    XComModel.task_id == task_id,
                    XComModel.key == "return_value",
                )
            )
        return json.loads(value) if isinstance(value, str) else value

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        """The ``extra`` of each event of the asset ``uri``, oldest first."""
        from airflow.models.asset import AssetEvent, AssetModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            query = select(AssetEvent.extra).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            return list(session.scalars(query.where(AssetModel.uri == uri).order_by(AssetEvent.id)))

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.Popen[str]:
        """``airflow ARGS`` in a process of its own (the DAG file parsed there, the task run there)."""
        return subprocess.Popen(
            [AIRFLOW, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "AIRFLOW_VAR_INGEST_PIPELINES_DIR": str(self.folder), **(env or {})},
            cwd=REPO,
        )


def quick_retries(dag: Any, retries: int = 1) -> Any:
    """The shipped back-off (30 s, doubling) is for production; a test waits about a second between tries."""
    for task in dag.tasks:
        task.retries, task.retry_delay, task.retry_exponential_backoff = retries, timedelta(0), 0
    return dag


def dag_id(env: Env) -> str:
    return f"ingest_{env.config_path.stem}"


@pytest.fixture
def airflow(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Airflow]:
    """The pipelines folder is the test's tmp_path, where `make_env` writes its config files."""
    monkeypatch.setenv("AIRFLOW_VAR_INGEST_PIPELINES_DIR", str(tmp_path))
    yield Airflow(tmp_path)
