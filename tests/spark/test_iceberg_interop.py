"""A standard Iceberg reader on Spark reads what both engines wrote: rows, dead letters, the snapshot
summaries carrying the ledger, and every snapshot by time travel.

The reader is Iceberg's own Spark runtime (from Maven Central: ``tests/spark/iceberg_runtime.py``) in a
spark-submit process of its own: through Iceberg's JDBC catalog on the PostgreSQL catalog (the same
``iceberg_tables`` that pyiceberg's SQL catalog writes), and by metadata file on the SQLite catalog
(a JVM must not open the SQLite file that pyiceberg writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.conftest import MakeEnv
from tests.integration.test_changelog import changelog, debezium_stream, fold, send
from tests.runs import one_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.assembly import open_pipeline
from ingest.engines.spark import SparkEngine
from tests.spark.iceberg_jvm import iceberg_jars_fixture, jdbc_catalog, read  # noqa: F401  (fixture iceberg_jars)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_iceberg_spark_reads_tables_summaries_and_time_travels(
    make_env: MakeEnv, catalog_kind: str, spark: SparkSession, iceberg_jars: list[Path]
) -> None:
    env = make_env(batch={"max_records": 1_600})
    env.produce(3_000, bad_every=11)
    pipeline = open_pipeline(env.config)
    first = one_batch(pipeline)  # local engine
    second = pipeline.run_batch(SparkEngine.create(pipeline.config, pipeline.rows, spark))
    assert (first.status, second.status) == ("committed", "committed")
    rows, dead = env.counts()
    pipeline.rows.refresh()
    pipeline.dead.refresh()

    if catalog_kind == "postgres":
        catalog = env.config.catalog
        tables = [f"{catalog['name']}.{env.config.table}", f"{catalog['name']}.{env.config.dead_letters}"]
        seen = read(iceberg_jars, tables, jdbc_catalog(catalog))
    else:
        tables = [pipeline.rows.table.metadata_location, pipeline.dead.table.metadata_location]
        seen = read(iceberg_jars, tables)
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


def test_iceberg_spark_reads_a_row_delta_as_pyiceberg_does(tmp_path: Path, iceberg_jars: list[Path]) -> None:
    """A changelog batch's commit (position deletes and new rows in one snapshot) reads the same
    through Iceberg's Spark runtime as through pyiceberg, at every snapshot, and so does the
    compaction that applies the deletes and removes their files."""
    import pyarrow as pa

    from ingest.config import MaintenanceSpec
    from ingest.iceberg.catalog import connect
    from ingest.iceberg.layout import open_table
    from ingest.iceberg.schema import rows_schema
    from ingest.intents import Append, RowDelta
    from ingest.ops.maintain import compact
    from tests.integration.test_table_contract import KEY, key_rows, rows

    catalog = connect({"name": "c", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()})
    table = open_table(catalog, "c.orders", rows_schema([]))
    table.refresh()
    table.commit(Append(table.write(rows(0, 5)), {}))
    table.commit(Append(table.write(rows(5, 10)), {}))
    table.commit(RowDelta(table.write(pa.concat_tables([rows(3, 4), rows(12, 13)])), KEY, key_rows(3, 7, 12), {}))
    table.commit(RowDelta([], KEY, key_rows(3, 8), {}))
    compacted = compact(table, MaintenanceSpec())  # `ingest maintain`: the deletes applied, their files removed
    assert (compacted.files_removed, compacted.delete_files_removed) == (3, 4)
    location = table.table.metadata_location

    seen = read(iceberg_jars, [location])[location]

    mine = catalog.load_table("c.orders")
    expected = {str(s.snapshot_id): mine.scan(snapshot_id=s.snapshot_id).count() for s in mine.snapshots()}
    assert list(expected.values()) == [5, 10, 10, 8, 8]
    assert seen["as_of"] == expected
    assert (seen["count"], seen["distinct"]) == (8, 8)
    assert [s["operation"] for s in seen["snapshots"]] == ["append", "append", "overwrite", "delete", "overwrite"]


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_iceberg_spark_reads_a_changelog_both_engines_landed_as_pyiceberg_does(
    make_env: MakeEnv, spark: SparkSession, iceberg_jars: list[Path]
) -> None:
    env = changelog(make_env, max_records=600)
    events = debezium_stream(2_000, 300, seed=17)
    send(env, events)
    pipeline = open_pipeline(env.config)
    first = one_batch(pipeline)  # local engine
    engine = SparkEngine.create(pipeline.config, pipeline.rows, spark)
    rest = list(pipeline.run(engine, until_caught_up=True, max_batches=None))
    assert [first.status, *(r.status for r in rest)] == ["committed"] * (1 + len(rest))
    pipeline.rows.refresh()
    table = pipeline.rows.table
    location = table.metadata_location

    seen = read(iceberg_jars, [location])[location]

    expected = {str(s.snapshot_id): table.scan(snapshot_id=s.snapshot_id).count() for s in table.snapshots()}
    assert seen["as_of"] == expected
    assert seen["count"] == seen["distinct"] == len(fold(events))  # a row per live key, each change's own
