"""Apicurio Registry for the test suite: a real Schema Registry serving the Confluent REST API.

``resolve()`` unpacks the Quarkus application from Maven Central (``pom.xml`` beside this file)
into ``.cache/apicurio-<version>/app``, once (:mod:`tests.services.maven`). :class:`Apicurio`
runs it on a free port with its in-memory storage, on the newest JDK under ``/usr/lib/jvm`` (it
needs Java 21 or newer), is ready when the Confluent-compatible API answers, and stops it. Clients
use ``url``: ``http://127.0.0.1:<port>/apis/ccompat/v7``. Nothing here is used by the pipeline.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from ingest.kafka.embedded import free_port
from tests.services import maven

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
POM = HERE / "pom.xml"
VERSION = maven.pinned(POM, "apicurio.version")
APP = REPO / ".cache" / f"apicurio-{VERSION}" / "app"
JAVA_NEEDED = 21
START_TIMEOUT_S = 120.0


class RegistryUnavailable(Exception):
    """No Java 21+, no Maven, or the registry would not start."""


def java() -> str:
    """The newest ``java`` under /usr/lib/jvm (or on PATH) of version JAVA_NEEDED or newer."""
    candidates = sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)
    on_path = shutil.which("java")
    found: list[tuple[int, str]] = []
    for candidate in [*map(str, candidates), *([on_path] if on_path else [])]:
        done = subprocess.run([candidate, "-version"], capture_output=True, text=True)
        match = re.search(r'version "(\d+)', done.stderr)
        if match and int(match.group(1)) >= JAVA_NEEDED:
            found.append((int(match.group(1)), candidate))
    if not found:
        raise RegistryUnavailable(f"Apicurio Registry {VERSION} needs Java {JAVA_NEEDED}+; none under /usr/lib/jvm")
    return max(found)[1]


def resolve() -> Path:
    try:
        return maven.resolve(POM, APP, f"Apicurio Registry {VERSION}", unpack=True)
    except maven.MavenUnavailable as error:
        raise RegistryUnavailable(str(error)) from None


class Apicurio:
    """One Apicurio Registry process (in-memory storage, no authentication) on 127.0.0.1."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.management_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    @property
    def log(self) -> Path:
        return self.directory / "apicurio.log"

    def start(self) -> Apicurio:
        app = resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            java(),
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.management.host=127.0.0.1",
            f"-Dquarkus.management.port={self.management_port}",
            "-jar",
            str(app / "quarkus-run.jar"),
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RegistryUnavailable(f"Apicurio exited with {self.process.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RegistryUnavailable(f"Apicurio did not answer within {START_TIMEOUT_S:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> Apicurio:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
