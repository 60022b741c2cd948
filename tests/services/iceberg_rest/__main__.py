"""``python -m tests.services.iceberg_rest resolve``: fetch Iceberg's REST catalog server from Maven
Central into .cache/ (the tests do it on first use too).

``python -m tests.services.iceberg_rest run -- COMMAND…``: run COMMAND with a REST catalog whose
warehouse lies in a bucket of moto's S3 server, both started for it and stopped after, and with
``ICEBERG_REST_URI``, ``S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_REGION`` set as ``conf/orders_rest_s3.yaml`` reads them
(``make demo DEMO_CATALOG=rest+s3``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.services.iceberg_rest import RestCatalog, RestUnavailable, resolve
from tests.services.moto import S3Server, S3Unavailable

USAGE = "usage: python -m tests.services.iceberg_rest resolve | run -- COMMAND..."


def run(command: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with S3Server(Path(tmp) / "moto.log") as s3:
                s3.create_bucket("lake")
                s3_properties = s3.properties()
                with RestCatalog(Path(tmp) / "rest", "s3://lake/warehouse", s3_properties) as catalog:
                    print(f"REST catalog at {catalog.uri}, warehouse s3://lake/warehouse on S3 at {s3.endpoint}")
                    env = {
                        **os.environ,
                        "ICEBERG_REST_URI": catalog.uri,
                        "S3_ENDPOINT": s3.endpoint,
                        "AWS_ACCESS_KEY_ID": s3_properties["s3.access-key-id"],
                        "AWS_SECRET_ACCESS_KEY": s3_properties["s3.secret-access-key"],
                        "AWS_REGION": s3_properties["s3.region"],
                    }
                    return subprocess.call(command, env=env)
        except (RestUnavailable, S3Unavailable) as error:
            sys.exit(f"cannot start the REST catalog and S3 server: {error}")


def main(argv: list[str]) -> int:
    if argv == ["resolve"]:
        try:
            print(resolve())
        except RestUnavailable as error:
            sys.exit(f"Iceberg's REST catalog server is not available: {error}")
        return 0
    if len(argv) < 3 or argv[:2] != ["run", "--"]:
        sys.exit(USAGE)
    return run(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
