"""A standard Iceberg reader on Spark (Iceberg's own Spark runtime), run by spark-submit in the interop test.

    spark-submit --jars RUNTIME,JACKSON[,JDBC] [--conf spark.sql.catalog.NAME...] iceberg_reader.py TABLE...

Each TABLE is a metadata.json location (read by path) or ``catalog.namespace.table`` (read through
the configured Spark catalog). Prints one JSON object: per table its row count, the number of
distinct Kafka coordinates, its snapshots (id, parent, operation, summary) and the row count as
of every snapshot (time travel).
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import DataFrame, SparkSession


def _by_path(spark: SparkSession, location: str) -> tuple[DataFrame, DataFrame, dict[int, int]]:
    reader = spark.read.format("iceberg")
    snapshots = reader.load(f"{location}#snapshots")
    ids = [row.snapshot_id for row in snapshots.select("snapshot_id").collect()]
    as_of = {i: spark.read.format("iceberg").option("snapshot-id", i).load(location).count() for i in ids}
    return reader.load(location), snapshots, as_of


def _by_catalog(spark: SparkSession, name: str) -> tuple[DataFrame, DataFrame, dict[int, int]]:
    snapshots = spark.table(f"{name}.snapshots")
    ids = [row.snapshot_id for row in snapshots.select("snapshot_id").collect()]
    as_of = {i: spark.sql(f"SELECT * FROM {name} VERSION AS OF {i}").count() for i in ids}
    return spark.table(name), snapshots, as_of


def describe(spark: SparkSession, table: str) -> dict[str, object]:
    data, snapshots, as_of = (_by_path if "://" in table or table.startswith("/") else _by_catalog)(spark, table)
    key = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]
    if not set(key) <= set(data.columns):
        key = ["topic", "partition", "offset"]  # the dead-letter table
    return {
        "count": data.count(),
        "distinct": data.select(*key).distinct().count(),
        "snapshots": [
            {
                "snapshot_id": row.snapshot_id,
                "parent_id": row.parent_id,
                "operation": row.operation,
                "summary": dict(row.summary),
            }
            for row in snapshots.orderBy("committed_at").collect()
        ],
        "as_of": {str(k): v for k, v in as_of.items()},
    }


if __name__ == "__main__":
    session = SparkSession.builder.getOrCreate()
    try:
        print(json.dumps({table: describe(session, table) for table in sys.argv[1:]}))
    finally:
        session.stop()
