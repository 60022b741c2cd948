"""A Spark standalone cluster for the tests: one master and workers, each its own JVM, on free ports.

Started with pyspark's own ``spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``), as ``sbin/start-master.sh`` would, but in the foreground so the test owns the
processes. Ready when the master's status endpoint (``/json/`` on its web UI port) lists every
worker as alive, never after a sleep. An application submitted to :attr:`url` gets executors on the
workers: separate JVMs, with their own Python workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from ingest.kafka.embedded import free_port


class SparkUnavailable(Exception):
    """pyspark is missing, or a master or worker would not start."""


def spark_class() -> Path:
    try:
        import pyspark
    except ImportError:
        raise SparkUnavailable("pyspark is not installed: pip install 'lakehouse-ingest[spark]'") from None
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class SparkStandalone:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workdir = workdir
        self.port, self.ui_port = free_port(), free_port()
        self.workers, self.cores, self.memory = workers, cores, memory
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dirs(self) -> list[Path]:
        return [self.workdir / f"worker-{i + 1}" for i in range(self.workers)]

    def status(self) -> dict[str, Any]:
        """The master's view: workers, running and completed applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            status: dict[str, Any] = json.loads(answer.read())
            return status

    def _start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115  (kept by the process)
        environment = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        self._processes.append(
            subprocess.Popen(
                [str(spark_class()), *args], stdout=log, stderr=log, env=environment, start_new_session=True
            )
        )

    def start(self, timeout_s: float = 120.0) -> SparkStandalone:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)),
        )
        self._wait(lambda status: status.get("status") == "ALIVE", "the master", timeout_s)
        for i, directory in enumerate(self.worker_dirs()):
            directory.mkdir(exist_ok=True)
            self._start(
                f"worker-{i + 1}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--webui-port", str(free_port())),
                *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(directory), self.url),
            )
        self._wait(lambda status: status.get("aliveworkers") == self.workers, f"{self.workers} workers", timeout_s)
        return self

    def _wait(self, ready: Any, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = [p for p in self._processes if p.poll() is not None]
            if exited:
                self.stop()
                raise SparkUnavailable(f"a Spark process exited with {exited[0].returncode}; see {self.workdir}/*.log")
            try:
                if ready(self.status()):
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.2)
        self.stop()
        raise SparkUnavailable(f"{what} of the standalone cluster did not come up within {timeout_s}s")

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until no application runs on the cluster (a killed driver's executors are released)."""
        deadline = time.monotonic() + timeout_s
        while self.status().get("activeapps"):
            if time.monotonic() > deadline:
                raise AssertionError(f"applications still running: {self.status()['activeapps']}")
            time.sleep(0.2)

    def stop(self) -> None:
        for process in reversed(self._processes):  # workers first, then the master
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes = []

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()
