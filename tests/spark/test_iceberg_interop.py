"""A standard Iceberg reader on Spark reads what both engines wrote: rows, dead letters, the snapshot
summaries carrying the ledger, and every snapshot by time travel.

The reader is Iceberg's own Spark runtime (built by ``tests/spark/iceberg_runtime.py``) in a
spark-submit process of its own: through Iceberg's JDBC catalog on the PostgreSQL catalog (the same
``iceberg_tables`` that pyiceberg's SQL catalog writes), and by metadata file on the SQLite catalog
(a JVM must not open the SQLite file that pyiceberg writes).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.pipeline import Pipeline
from ingest.spark import SparkEngine
from tests.integration.conftest import POSTGRES_URI, REPO
from tests.spark.conftest import TEST_CONF, spark_submit_binary
from tests.spark.iceberg_runtime import Unavailable, build, postgres_jdbc

pytestmark = [pytest.mark.integration, pytest.mark.spark]

READER = Path(__file__).with_name("iceberg_reader.py")


@pytest.fixture(scope="session")
def iceberg_jars() -> list[Path]:
    try:
        return build()
    except Unavailable as error:
        pytest.skip(f"the Iceberg Spark runtime cannot be built here: {error}")


def _jdbc_catalog(name: str, warehouse: str) -> dict[str, str]:
    uri = urlsplit(POSTGRES_URI)
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": f"jdbc:postgresql://{uri.hostname}:{uri.port or 5432}{uri.path}",
        f"{prefix}.warehouse": warehouse,
    }
    if uri.username:
        conf[f"{prefix}.jdbc.user"] = uri.username
    if uri.password:
        conf[f"{prefix}.jdbc.password"] = uri.password
    return conf


def _read(jars: list[Path], tables: list[str], conf: dict[str, str]) -> dict[str, dict]:  # type: ignore[type-arg]
    settings = {
        **TEST_CONF,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        **conf,
    }
    command = [str(spark_submit_binary()), "--master", "local[2]", "--jars", ",".join(map(str, jars))]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    result = subprocess.run(
        [*command, str(READER), *tables], capture_output=True, text=True, timeout=300, cwd=REPO, env=os.environ
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_iceberg_spark_reads_tables_summaries_and_time_travels(make_env, catalog_kind, spark, iceberg_jars) -> None:
    env = make_env(batch={"max_records": 1_600})
    env.produce(3_000, bad_every=11)
    pipeline = Pipeline.open(env.config)
    first = pipeline.run_batch()  # local engine
    second = pipeline.run_batch(SparkEngine.create(pipeline, spark))
    assert (first.status, second.status) == ("committed", "committed")
    rows, dead = env.counts()
    pipeline.rows.refresh()
    pipeline.dead.refresh()

    if catalog_kind == "postgres":
        catalog = env.config.catalog
        tables = [f"{catalog['name']}.{env.config.table}", f"{catalog['name']}.{env.config.dead_letters}"]
        seen = _read([*iceberg_jars, postgres_jdbc()], tables, _jdbc_catalog(catalog["name"], catalog["warehouse"]))
    else:
        tables = [pipeline.rows.table.metadata_location, pipeline.dead.table.metadata_location]
        seen = _read(iceberg_jars, tables, {})
    on_rows, on_dead = seen[tables[0]], seen[tables[1]]

    assert (on_rows["count"], on_rows["distinct"]) == (rows, rows) == (3_000 - env.bad, 3_000 - env.bad)
    assert (on_dead["count"], on_dead["distinct"]) == (dead, dead) == (env.bad, env.bad)
    summaries = [s["summary"] for s in on_rows["snapshots"]]
    assert [s["ingest.orders.batch"] for s in summaries] == ["1", "2"]
    ours = {snap.snapshot_id: snap.summary for snap in pipeline.rows.ancestry()}
    for snapshot in on_rows["snapshots"]:
        mine = ours[snapshot["snapshot_id"]]
        assert {k: v for k, v in snapshot["summary"].items() if k.startswith("ingest.")} == {
            k: v for k, v in mine.items() if k.startswith("ingest.")
        }
    first_id, second_id = (str(s["snapshot_id"]) for s in on_rows["snapshots"])
    assert on_rows["as_of"] == {first_id: first.records, second_id: first.records + second.records}
