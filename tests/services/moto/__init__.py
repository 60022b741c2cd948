"""An S3 server for the test suite: moto's, in a virtualenv of its own.

moto's server brings Flask, Werkzeug and pins of its own that have no business in the project's
environment (beside Airflow's), so it lives apart. ``install()`` makes ``.cache/moto-<version>`` from the pinned
``requirements.txt`` beside this file, once (a ``.complete`` marker says it finished).
:class:`S3Server` runs ``moto_server`` on 127.0.0.1 and a free port: real S3 over HTTP, which
pyiceberg's and pyarrow's S3 clients talk to as to any S3 endpoint. Nothing here is used by the
pipeline.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType

from ingest.kafka.embedded import free_port
from tests.services.ready import ready, stop

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
REQUIREMENTS = HERE / "requirements.txt"
_PIN = re.search(r"^moto==(\S+)$", REQUIREMENTS.read_text(), re.M)
assert _PIN is not None, f"{REQUIREMENTS} pins no moto version"
VERSION = _PIN.group(1)
VENV = REPO / ".cache" / f"moto-{VERSION}"
ACCESS_KEY = "ingest-test"
SECRET_KEY = "ingest-test-secret"  # moto checks no signature; any pair will do
REGION = "us-east-1"


class S3Unavailable(Exception):
    """moto could not be installed from PyPI, or its server would not start."""


def install() -> Path:
    """moto's ``moto_server``, installing it into its virtualenv the first time."""
    server = VENV / "bin" / "moto_server"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # one installer at a time (the tests, `make catalogs`, the bench); a venv cannot be built
    # elsewhere and moved in, its scripts name their interpreter by path
    with open(VENV.with_name(VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (VENV / ".complete").exists():
            return server
        shutil.rmtree(VENV, ignore_errors=True)  # a partial install: start over
        steps = [
            [sys.executable, "-m", "venv", str(VENV)],
            [str(VENV / "bin" / "pip"), "install", "--quiet", "-r", str(REQUIREMENTS)],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise S3Unavailable(f"{' '.join(step[:3])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (VENV / ".complete").touch()
    return server


class S3Server:
    """``moto_server`` on 127.0.0.1 and a free port; ``properties()`` are pyiceberg's S3 settings."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        """The catalog properties that point pyiceberg's file IO at this server."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }

    def start(self, timeout_s: float = 60.0) -> S3Server:
        try:
            server = install()
        except (OSError, subprocess.SubprocessError) as error:
            raise S3Unavailable(f"cannot install moto: {error}") from None
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(server), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            ready(self.process, f"{self.endpoint}/moto-api/", timeout_s, self.log)
        except TimeoutError as error:
            self.stop()
            raise S3Unavailable(f"moto_server {error}") from None
        return self

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        stop(self.process, 10)
        self.process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
