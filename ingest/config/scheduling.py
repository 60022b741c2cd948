"""``airflow:``: how Airflow runs a config's DAG (:func:`ingest.airflow.pipeline_dags`).

The DAG processor reads this block alone, from the YAML as written (no ``${ENV}`` interpolation,
no other section): parsing a DAG file needs no secret and touches no metadata database.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AwareDatetime, BeforeValidator, Field, ValidationError, field_validator

from ingest import durations
from ingest.config.sections import Strict


def _duration(value: Any) -> Any:
    if isinstance(value, str):
        return timedelta(seconds=durations.seconds(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    return value


#: ``30s``, ``5m``, ``1h``, ``1d`` or a number of seconds
Duration = Annotated[timedelta, BeforeValidator(_duration, json_schema_input_type=str | float)]


class AirflowSpec(Strict):
    """How Airflow runs this config's DAG ``ingest_<file name>`` (``airflow:``)."""

    schedule: str | None = "*/5 * * * *"
    """when the DAG runs: a cron expression or a preset such as ``@hourly``; null: only when triggered"""
    start_date: AwareDatetime | date = datetime(2026, 1, 1, tzinfo=UTC)
    """the DAG's start date (a date is midnight UTC); runs before it are never made (no catch-up)"""
    retries: Annotated[int, Field(ge=0)] = 4
    """how often a failed retryable ``ingest`` task is tried again (fatal errors are not retried)"""
    retry_delay: Duration = timedelta(seconds=30)
    """the first retry's delay; each next one doubles it, up to 5 minutes"""
    execution_timeout: Duration | None = timedelta(hours=1)
    """the ``ingest`` task is killed past this (the batch in flight leaves no trace); null: no limit"""
    max_staleness: Duration = timedelta(minutes=30)
    """the ``freshness`` task fails when the table's data is complete only through a time older than this"""
    tags: list[str] = []
    """tags of the DAG, beside ``lakehouse-ingest``"""
    pool: str | None = None
    """the Airflow pool the ``ingest`` task runs in; default: ``default_pool``"""
    engine: Literal["local", "spark"] = "local"
    """``local``: the ``ingest`` task runs the batches in the worker; ``spark``: it spark-submits the Spark job"""

    @field_validator("start_date")
    @classmethod
    def _midnight_utc(cls, value: datetime | date) -> datetime:
        if isinstance(value, datetime):
            return value
        return datetime(value.year, value.month, value.day, tzinfo=UTC)

    @property
    def start(self) -> datetime:
        assert isinstance(self.start_date, datetime)
        return self.start_date


def dag_settings(config_path: Path) -> tuple[AirflowSpec, str | None]:
    """``config_path``'s ``airflow:`` block, read alone; the defaults and what is wrong when it cannot
    be read (the whole config's load, in the task, then fails with the same error)."""
    try:
        data = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        block = data.get("airflow") if isinstance(data, dict) else None
        return AirflowSpec.model_validate(block if block is not None else {}), None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        return AirflowSpec(), f"the file cannot be read: {error}"
    except ValidationError as error:
        wrong = "; ".join(f"airflow.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        return AirflowSpec(), wrong
