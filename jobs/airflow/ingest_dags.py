"""One Airflow DAG per pipeline config: ``ingest_<file stem>`` for every ``*.yaml`` in the pipelines folder.

The folder is the environment variable ``AIRFLOW_VAR_INGEST_PIPELINES_DIR``; without it, this
repository's ``conf/``. Each config's ``airflow:`` block shapes its DAG (schedule, start date,
tags, retries, timeouts, pool, the engine; by default every five minutes, 4 retries with
exponential back-off, a 1 h timeout, a 30 min freshness bound, the local engine): task ``ingest``
commits batches until caught up, ``freshness`` fails when the committed data is older than the
bound. Parsing this file reads no Airflow Variable or connection. Everything else is in
``ingest/airflow.py`` and ``ingest/airflow_operators.py``.
"""

from pathlib import Path

from ingest.airflow import pipeline_dags

REPO = Path(__file__).resolve().parents[2]

globals().update(
    pipeline_dags(
        __file__,
        default_folder=REPO / "conf",
        spark_application=REPO / "jobs" / "spark_ingest.py",
    )
)
