"""One Airflow DAG per pipeline config: ``ingest_<file stem>`` for every ``*.yaml`` in the pipelines folder.

The folder is the Airflow Variable ``ingest_pipelines_dir`` (or the environment variable
``AIRFLOW_VAR_INGEST_PIPELINES_DIR``); without it, this repository's ``conf/``. Each DAG runs every
five minutes, without catch-up, one run at a time, with retries and exponential back-off: task
``ingest`` commits batches until caught up, ``freshness`` fails when the committed data is older
than MAX_STALENESS. The Variable ``ingest_engine=spark`` runs ``jobs/spark_ingest.py`` with
spark-submit instead. Everything else is in ``ingest/airflow.py``.
"""

from datetime import timedelta
from pathlib import Path

from ingest.airflow import pipeline_dags

REPO = Path(__file__).resolve().parents[2]
MAX_STALENESS = timedelta(minutes=30)

globals().update(
    pipeline_dags(
        __file__,
        default_folder=REPO / "conf",
        max_staleness=MAX_STALENESS,
        spark_application=REPO / "jobs" / "spark_ingest.py",
    )
)
