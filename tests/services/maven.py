"""Jars from Maven Central for the test suite's real components (Apache Kafka, Iceberg's Spark
runtime, Apicurio Registry).

``resolve(pom, lib)`` copies the dependencies a small pom declares into ``lib`` with Maven
(``dependency:copy-dependencies``), or with ``unpack`` unpacks the archive the pom's
``dependency:unpack`` names there, once: a ``.complete`` marker beside ``lib`` says it finished,
and a second call only checks for it. Nothing is built; the jars go on a classpath. One process
resolves at a time (a lock file beside ``lib``): `make test` runs the suite on two.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Maven's closing advice, the same after every failure
_BOILERPLATE = ("To see the full stack trace", "Re-run Maven", "For more information", "[Help ")


class MavenUnavailable(Exception):
    """Java or Maven is missing, or Maven could not resolve the pom's dependencies."""


def pinned(pom: Path, tag: str) -> str:
    """The version ``pom`` pins in its property ``<tag>``."""
    found = re.search(rf"<{re.escape(tag)}>([^<]+)</{re.escape(tag)}>", pom.read_text())
    assert found is not None, f"{pom} has no <{tag}>"
    return found.group(1)


def _complete(lib: Path) -> Path:
    return lib.parent / ".complete"


def unavailable(lib: Path) -> str | None:
    """Why the jars in ``lib`` cannot be run here (None: they can, or Maven can fetch them)."""
    if _complete(lib).exists():
        return None if shutil.which("java") else "java is not on PATH"
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def resolve(pom: Path, lib: Path, what: str, *, unpack: bool = False) -> Path:
    """``lib``, holding the jars ``pom`` depends on, resolved from Maven Central the first time."""
    if _complete(lib).exists():
        return lib
    reason = unavailable(lib)
    if reason:
        raise MavenUnavailable(reason)
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.with_name(lib.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(lib).exists():  # another process resolved it while this one waited
            return lib
        return _resolve(pom, lib, what, unpack=unpack)


def _resolve(pom: Path, lib: Path, what: str, *, unpack: bool) -> Path:
    staging = lib.with_name(lib.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    goal = (
        ["dependency:unpack", f"-DunpackTo={staging}"]
        if unpack
        else ["dependency:copy-dependencies", f"-DoutputDirectory={staging}"]
    )
    command = ["mvn", "-q", "-B", "-f", str(pom), *goal]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise MavenUnavailable(f"mvn could not resolve {what} ({pom}): {_errors(done.stdout + done.stderr)}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    _complete(lib).touch()
    return lib


def _errors(output: str) -> str:
    """Maven's own error lines, on one line (its output's tail where it printed none)."""
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    found = [line for line in errors if line and not line.startswith(_BOILERPLATE)]
    return " / ".join(found)[:2000] if found else output[-2000:]
