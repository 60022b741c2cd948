"""spark-submit entry point: one ``ingest run`` with the Spark engine.

    spark-submit jobs/spark_ingest.py -c conf/orders.yaml --until-caught-up

is ``ingest run --engine spark -c conf/orders.yaml --until-caught-up`` run by spark-submit: every
option of ``ingest run`` works (``--max-batches``, ``--every``, ``--json``; ``-v`` anywhere), and
spark-submit passes the CLI's exit code on (0 ok, 75 retryable, 65 fatal, 78 configuration,
1 internal). Spark settings come from spark-submit and spark-defaults.conf; see
conf/spark-defaults.conf.example for them and for shipping the package to executors.

spark-submit merges the Python driver's stderr into its stdout (Spark's PythonRunner), so log
lines land among ``--json``'s objects there: with ``--json``, the progress lines (one every 30 s
while a batch runs) are off unless ``--progress-every`` asks for them, and stdout stays one JSON
object per batch but for warnings.
"""

import sys

from ingest.cli import main

if __name__ == "__main__":
    verbose = [arg for arg in sys.argv[1:] if arg in ("-v", "--verbose")]
    rest = [arg for arg in sys.argv[1:] if arg not in ("-v", "--verbose")]
    asked = any(arg in ("-q", "--quiet") or arg.startswith("--progress-every") for arg in rest)
    if "--json" in rest and not asked:
        rest.append("--quiet")
    sys.argv[1:] = [*verbose, "run", "--engine", "spark", *rest]
    main()
