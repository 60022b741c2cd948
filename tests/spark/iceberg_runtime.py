"""Iceberg's Spark runtime for pyspark 3.5 and the PostgreSQL JDBC driver, from Maven Central, for
the interop tests.

``pom.xml`` beside this file names them (``iceberg-spark-runtime-3.5_2.12`` and
``org.postgresql:postgresql``); Maven copies them into ``.cache/iceberg-spark-3.5-<version>/lib``
once (:mod:`tests.services.maven`), and a second run only checks the cache.

    python tests/spark/iceberg_runtime.py     # make iceberg-spark: prints the jar paths
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.services import maven

REPO = Path(__file__).resolve().parents[2]
POM = Path(__file__).with_name("pom.xml")
VERSION = maven.pinned(POM, "iceberg.version")
LIB = REPO / ".cache" / f"iceberg-spark-3.5-{VERSION}" / "lib"


class Unavailable(Exception):
    """The jars cannot be had here; the message says why and how to fix it."""


def _lib() -> Path:
    try:
        return maven.resolve(POM, LIB, f"Iceberg's Spark runtime {VERSION}")
    except maven.MavenUnavailable as error:
        raise Unavailable(str(error)) from None


def _one(pattern: str) -> Path:
    found = sorted(_lib().glob(pattern))
    if len(found) != 1:
        raise Unavailable(f"expected one {pattern} in {LIB}, found {[p.name for p in found]}")
    return found[0]


def build() -> list[Path]:
    """The jars for ``spark.jars``: Iceberg's runtime (resolved once, cached)."""
    return [_one("iceberg-spark-runtime-3.5_2.12-*.jar")]


def postgres_jdbc() -> Path:
    """The driver for Iceberg's JDBC catalog on the PostgreSQL catalog."""
    return _one("postgresql-*.jar")


if __name__ == "__main__":
    try:
        print("\n".join(str(jar) for jar in [*build(), postgres_jdbc()]))
    except Unavailable as error:
        sys.exit(f"cannot resolve Iceberg's Spark runtime: {error}")
