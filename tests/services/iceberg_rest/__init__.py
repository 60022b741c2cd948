"""Apache Iceberg's REST catalog server for the test suite, resolved from Maven Central.

``resolve()`` copies the server's jars (``pom.xml`` beside this file) into
``.cache/iceberg-rest-<version>/lib`` with Maven, once (:mod:`tests.services.maven`).
:class:`RestCatalog` runs ``org.apache.iceberg.rest.RESTCatalogServer``: a JDBC catalog in a SQLite
file behind Iceberg's REST protocol, its warehouse a local directory or an S3 bucket, on a free
port; it is ready when ``GET /v1/config`` answers. The server reads its catalog properties from
``CATALOG_*`` variables (the prefix dropped, ``__`` for ``-``, ``_`` for ``.``). Nothing here is
used by the pipeline.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import TracebackType

from ingest.kafka.embedded import free_port
from tests.services import maven
from tests.services.ready import ready, stop

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
POM = HERE / "pom.xml"
VERSION = maven.pinned(POM, "iceberg.version")
LIB = REPO / ".cache" / f"iceberg-rest-{VERSION}" / "lib"


class RestUnavailable(Exception):
    """Java or Maven is missing, Maven could not resolve the server, or it would not start."""


def unavailable() -> str | None:
    """Why the server cannot run here (None: it can)."""
    return maven.unavailable(LIB)


def resolve() -> Path:
    """The server's classpath directory, resolving it from Maven Central the first time."""
    try:
        return maven.resolve(POM, LIB, f"Iceberg's REST catalog server {VERSION}")
    except maven.MavenUnavailable as error:
        raise RestUnavailable(str(error)) from None


def _variable(name: str) -> str:
    """The environment variable the server maps to catalog property ``name``."""
    return "CATALOG_" + name.replace("-", "__").replace(".", "_").upper()


class RestCatalog:
    """One REST catalog server: its JDBC store is ``directory``/catalog.db, its warehouse
    ``warehouse`` (a ``file://`` directory, or ``s3://bucket/prefix`` with ``s3`` its S3FileIO
    properties: ``s3.endpoint``, keys, region)."""

    def __init__(self, directory: Path, warehouse: str, s3: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.warehouse = warehouse
        self.s3 = dict(s3 or {})
        self.port = free_port()
        self.log = directory / "rest-catalog.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        """The server's catalog properties."""
        properties = {
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:sqlite:{self.directory / 'catalog.db'}",
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse,
            "rest.port": str(self.port),
        }
        if self.s3:
            properties |= {
                "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                "s3.endpoint": self.s3["s3.endpoint"],
                "s3.path-style-access": "true",
                "s3.access-key-id": self.s3["s3.access-key-id"],
                "s3.secret-access-key": self.s3["s3.secret-access-key"],
                "client.region": self.s3["s3.region"],
            }
        return properties

    def start(self, timeout_s: float = 90.0) -> RestCatalog:
        lib = resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {key: value for key, value in os.environ.items() if not key.startswith("CATALOG_")}
        env |= {_variable(name): value for name, value in self.properties().items()}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["java", "-Xmx512m", "-cp", f"{lib}/*", "org.apache.iceberg.rest.RESTCatalogServer"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.directory,
            )
        try:
            ready(self.process, f"{self.uri}/v1/config", timeout_s, self.log)
        except TimeoutError as error:
            self.stop()
            raise RestUnavailable(f"the REST catalog server {error}") from None
        return self

    def stop(self) -> None:
        stop(self.process, 15)
        self.process = None

    def __enter__(self) -> RestCatalog:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
