"""A foreign maintenance writer: Iceberg's own Spark runtime running SQL (procedure CALLs), by spark-submit.

    spark-submit --jars RUNTIME,JACKSON,JDBC --conf spark.sql.catalog.NAME... iceberg_maintain.py SQL...

Runs each SQL statement in order, e.g.
``CALL NAME.system.rewrite_data_files(table => 'ns.t', options => map('rewrite-all', 'true'))``, and
prints one JSON list: per statement, its result rows as objects.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

if __name__ == "__main__":
    session = SparkSession.builder.getOrCreate()
    try:
        results = [[row.asDict(recursive=True) for row in session.sql(sql).collect()] for sql in sys.argv[1:]]
        print(json.dumps(results, default=str))
    finally:
        session.stop()
