"""Apache Airflow 3 integration: one DAG per pipeline config, shaped by the config's ``airflow:``
block, of the operators of :mod:`ingest.airflow_operators` (imported from here).

With that module, the only one of the library that imports Airflow (``pip install
'lakehouse-ingest[airflow]'``). ``jobs/airflow/ingest_dags.py`` is the example DAG file; it only
calls :func:`pipeline_dags`.

A config ``orders.yaml`` in the pipelines folder becomes the DAG ``ingest_orders``: ``ingest >>
freshness``, no catch-up, one active run, on the block's schedule, start date, tags, retries,
timeouts, pool and engine (:class:`ingest.config.scheduling.AirflowSpec`; today's values when the
block is absent).

Parsing reads nothing but the files: the folder is ``default_folder`` or the environment variable
``AIRFLOW_VAR_INGEST_PIPELINES_DIR``, and of each config only its ``airflow:`` block, as written.
No Airflow Variable or connection is read and no metadata database is touched when a DAG file is
parsed (Airflow's best practices); secrets and the rest of the config are the task's to read. A
config whose block cannot be read still gets its DAG, with the defaults, a description and a tag
saying so: its ``ingest`` task then fails with the config's error, and the folder's other DAGs
are not hidden behind an import error.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

try:
    from airflow.sdk import DAG, TriggerRule
    from airflow.sdk.exceptions import AirflowTimetableInvalid
except ImportError as error:
    raise ImportError(
        "the Airflow integration needs Apache Airflow 3.3 or later: pip install 'lakehouse-ingest[airflow]'"
    ) from error

from ingest.airflow_operators import (
    FreshnessCheckOperator,
    IngestOperator,
    SparkExitCodePolicy,
    asset_alias,
    data_age,
    spark_ingest_operator,
    table_asset,
)
from ingest.config.scheduling import AirflowSpec, dag_settings

log = logging.getLogger(__name__)

__all__ = [
    "FreshnessCheckOperator",
    "IngestOperator",
    "SparkExitCodePolicy",
    "asset_alias",
    "data_age",
    "pipeline_dag",
    "pipeline_dags",
    "spark_ingest_operator",
    "table_asset",
]

#: the environment variable naming the pipelines folder (Airflow's form of a Variable, read here
#: as the environment only: no metadata database at parse time)
PIPELINES_DIR_ENV = "AIRFLOW_VAR_INGEST_PIPELINES_DIR"
#: every DAG's tag; a config whose ``airflow:`` block cannot be read adds :data:`INVALID_TAG`
TAG, INVALID_TAG = "lakehouse-ingest", "invalid-config"

DEFAULT_ARGS: dict[str, Any] = {
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=5),
}


def pipeline_dag(
    config_path: Path,
    *,
    spec: AirflowSpec | None = None,
    spark_application: str | Path | None = None,
    problem: str | None = None,
) -> DAG:
    """The DAG ``ingest_<file stem>`` of ``config_path``, as ``spec`` (its ``airflow:`` block) says:
    ``ingest >> freshness``, no catch-up, one active run. ``problem``: why the block could not be
    used (the DAG has the defaults, and says so)."""
    spec = spec if spec is not None else AirflowSpec()
    description = f"lakehouse-ingest pipeline {config_path}"
    if problem is not None:
        description += f" (its airflow: block was not used: {problem})"
    with DAG(
        dag_id=f"ingest_{config_path.stem}",
        description=description,
        schedule=spec.schedule,
        start_date=spec.start,
        catchup=False,
        max_active_runs=1,
        default_args={**DEFAULT_ARGS, "retries": spec.retries, "retry_delay": spec.retry_delay},
        tags=[TAG, *spec.tags, *([INVALID_TAG] if problem is not None else [])],
        auto_register=False,
    ) as dag:
        task: dict[str, Any] = {"execution_timeout": spec.execution_timeout}
        if spec.pool is not None:
            task["pool"] = spec.pool
        if spec.engine == "spark":
            if spark_application is None:
                raise ValueError("engine 'spark' needs spark_application (the path of jobs/spark_ingest.py)")
            ingest = spark_ingest_operator(
                task_id="ingest", config_path=config_path, application=spark_application, **task
            )
        else:
            ingest = IngestOperator(task_id="ingest", config_path=config_path, **task)
        freshness = FreshnessCheckOperator(
            task_id="freshness",
            config_path=config_path,
            max_staleness=spec.max_staleness,
            trigger_rule=TriggerRule.ALL_DONE,
        )
        ingest >> freshness
    dag.timetable.validate()  # (a schedule Airflow refuses is otherwise an import error of the whole file)
    return dag


def pipeline_dags(
    dag_file: str,
    *,
    default_folder: str | Path,
    max_staleness: timedelta | None = None,
    spark_application: str | Path | None = None,
) -> dict[str, DAG]:
    """One DAG per ``*.yaml`` in the pipelines folder, by DAG id, for the DAG file's ``globals()``.

    The folder is the environment variable ``AIRFLOW_VAR_INGEST_PIPELINES_DIR``, else
    ``default_folder``. ``max_staleness``: the freshness bound of the configs whose ``airflow:``
    block does not set one. ``spark_application`` (``jobs/spark_ingest.py``) for the configs whose
    engine is ``spark``. ``dag_file`` (the caller's ``__file__``) is where workers find the DAGs.
    """
    folder = Path(os.environ.get(PIPELINES_DIR_ENV) or default_folder)
    dags = {}
    for path in sorted(folder.glob("*.yaml")):
        path = path.resolve()
        spec, problem = dag_settings(path)
        if max_staleness is not None and "max_staleness" not in spec.model_fields_set:
            spec = spec.model_copy(update={"max_staleness": max_staleness})
        try:
            dag = pipeline_dag(path, spec=spec, spark_application=spark_application, problem=problem)
        except AirflowTimetableInvalid as error:
            problem = f"airflow.schedule {spec.schedule!r}: {error}"
            dag = pipeline_dag(path, spark_application=spark_application, problem=problem)
        except ValueError as error:  # a spark engine without its application
            problem = f"airflow.engine {spec.engine!r}: {error}"
            dag = pipeline_dag(path, spark_application=spark_application, problem=problem)
        if problem is not None:
            log.error("the DAG of %s has the default airflow: settings: %s", path, problem)
        dag.fileloc = str(Path(dag_file).resolve())
        dags[dag.dag_id] = dag
    return dags
