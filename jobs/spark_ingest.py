"""spark-submit entry point: one ``ingest run`` with the Spark engine.

    spark-submit jobs/spark_ingest.py -c conf/orders.yaml --until-caught-up

is ``ingest run --engine spark -c conf/orders.yaml --until-caught-up`` run by spark-submit: every
option of ``ingest run`` works (``--max-batches``, ``--every``, ``--json``; ``-v`` anywhere), and
spark-submit passes the CLI's exit code on (0 ok, 75 retryable, 65 fatal, 78 configuration,
1 internal). Spark settings come from spark-submit and spark-defaults.conf; see
conf/spark-defaults.conf.example for them and for shipping the package to executors.
"""

import sys

from ingest.cli import main

if __name__ == "__main__":
    verbose = [arg for arg in sys.argv[1:] if arg in ("-v", "--verbose")]
    rest = [arg for arg in sys.argv[1:] if arg not in ("-v", "--verbose")]
    sys.argv[1:] = [*verbose, "run", "--engine", "spark", *rest]
    main()
