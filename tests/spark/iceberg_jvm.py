"""Iceberg's own Spark runtime as a second, independent client of our tables, for the interop tests.

Each call is one spark-submit process (a JVM of its own, ~10 s here) running a small script:
``iceberg_reader.py`` (rows, snapshots, time travel) or ``iceberg_maintain.py`` (SQL such as
``CALL ... rewrite_data_files``, a real foreign writer). On the PostgreSQL catalog the JVM goes
through Iceberg's JDBC catalog, i.e. the same ``iceberg_tables`` rows that pyiceberg's SQL catalog
writes; a JVM must never open the SQLite file that pyiceberg writes (they lock each other), so on
SQLite it may only read, by metadata file.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests import strict
from tests.integration.conftest import POSTGRES_URI, REPO
from tests.spark.conftest import TEST_CONF, spark_submit_binary
from tests.spark.iceberg_runtime import Unavailable, build, postgres_jdbc

READER = Path(__file__).with_name("iceberg_reader.py")
MAINTAIN = Path(__file__).with_name("iceberg_maintain.py")
EXTENSIONS = {"spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"}


@pytest.fixture(scope="session", name="iceberg_jars")
def iceberg_jars_fixture() -> list[Path]:
    """Iceberg's Spark runtime (from Maven Central, once: ``make iceberg-spark``); skipped without it,
    failed in a strict run."""
    try:
        return build()
    except Unavailable as error:
        strict.missing(f"the Iceberg Spark runtime cannot be resolved here: {error}")


def jdbc_catalog(catalog: Mapping[str, str]) -> dict[str, str]:
    """Spark settings for Iceberg's JDBC catalog on the PostgreSQL catalog of a pipeline config.

    The Spark catalog takes the pyiceberg catalog's name: both filter ``iceberg_tables`` by it.
    """
    name, uri = catalog["name"], urlsplit(POSTGRES_URI)
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": f"jdbc:postgresql://{uri.hostname}:{uri.port or 5432}{uri.path}",
        f"{prefix}.warehouse": catalog["warehouse"],
    }
    if uri.username:
        conf[f"{prefix}.jdbc.user"] = uri.username
    if uri.password:
        conf[f"{prefix}.jdbc.password"] = uri.password
    return conf


def _submit(jars: list[Path], conf: Mapping[str, str], script: Path, *args: str) -> Any:
    """Run ``script`` under spark-submit with Iceberg's runtime; its last stdout line, as JSON."""
    if any(key.endswith(".type") and value == "jdbc" for key, value in conf.items()):
        jars = [*jars, postgres_jdbc()]
    command = [str(spark_submit_binary()), "--master", "local[2]", "--jars", ",".join(map(str, jars))]
    for key, value in {**TEST_CONF, **EXTENSIONS, **conf}.items():
        command += ["--conf", f"{key}={value}"]
    result = subprocess.run(
        [*command, str(script), *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=os.environ
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def read(jars: list[Path], tables: list[str], conf: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """What Iceberg's Spark reader sees of each table (metadata.json path, or ``catalog.ns.table``
    with ``conf`` from :func:`jdbc_catalog`): see ``iceberg_reader.py``."""
    seen: dict[str, dict[str, Any]] = _submit(jars, conf or {}, READER, *tables)
    return seen


def call(jars: list[Path], conf: Mapping[str, str], *statements: str) -> list[list[dict[str, Any]]]:
    """Run ``statements`` in one Spark session on the catalog of ``conf``; per statement, its result rows."""
    results: list[list[dict[str, Any]]] = _submit(jars, conf, MAINTAIN, *statements)
    return results
