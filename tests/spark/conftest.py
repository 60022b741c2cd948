"""The Spark engine against the real broker and catalogs, with Spark in local mode.

The integration fixtures (tansu broker, SQLite and PostgreSQL catalogs, :class:`Env`) are reused
as they are. Spark runs two ways, as users run it: in this process (a ``local[2]`` session shared by
the in-process tests) and as real driver processes (``ingest run --engine spark``, and
``spark-submit jobs/spark_ingest.py``) for the crash and retry tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.conftest import (  # noqa: F401  (fixtures)
    REPO,
    Env,
    bootstrap,
    catalog_kind,
    make_env,
    registry,
    rest_local,
    rest_s3,
    routed,
    s3,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# local mode: executors are this machine's processes, on this interpreter; Spark binds to loopback
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

SPARK_JOB = REPO / "jobs" / "spark_ingest.py"
#: settings for every Spark process the tests start (no UI port, quiet)
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
}


#: spark-submit's exit when its Python driver was SIGKILLed (a failpoint reached): Spark's PythonRunner
#: exits with the driver process's status as Java reports it, 128 + the signal
KILLED_DRIVER = 128 + signal.SIGKILL


def spark_submit_binary() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


@pytest.fixture(scope="session")
def spark_conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SPARK_CONF_DIR whose spark-defaults.conf is where ``ingest run --engine spark`` gets its settings."""
    directory = tmp_path_factory.mktemp("spark-conf")
    lines = ["spark.master local[2]", *(f"{k} {v}" for k, v in TEST_CONF.items())]
    (directory / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def spark_process_env(spark_conf_dir: Path) -> dict[str, str]:
    return {"SPARK_CONF_DIR": str(spark_conf_dir)}


def spark_submit_command(
    env: Env, *args: str, master: str = "local[2]", conf: dict[str, str] | None = None, config: Path | None = None
) -> list[str]:
    settings = {**TEST_CONF, **(conf or {})}
    command = [str(spark_submit_binary()), "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(SPARK_JOB), "-c", str(config or env.config_path), *args]


def spark_submit(
    env: Env,
    *args: str,
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
    config: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``spark-submit jobs/spark_ingest.py -c CONFIG ARGS``: the driver process users schedule."""
    return subprocess.run(
        spark_submit_command(env, *args, master=master, conf=conf, config=config),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(extra_env or {})},
        cwd=REPO,
    )


def data_files_on_disk(env: Env) -> int:
    """Parquet files under the rows table's data directory, committed or not."""
    from ingest.assembly import open_pipeline

    location = open_pipeline(env.config).rows.table.location().removeprefix("file://")
    return sum(1 for _ in Path(location, "data").rglob("*.parquet"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One ``local[2]`` session for the in-process tests (the JVM starts once)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("lakehouse-ingest-tests")
    for key, value in TEST_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()
