"""``ingest broker``: the embedded broker alone, to point a pipeline at, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ingest.kafka.admin import create_topic, ping, produce
from ingest.kafka.embedded import free_port
from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration


def test_ingest_broker_serves_kafka_until_sigterm_and_stops_its_broker() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ingest", "broker", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()  # printed once the broker answers
        assert f"on 127.0.0.1:{port}," in first, first + (process.stderr.read() if process.poll() is not None else "")
        assert f"export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}" in process.stdout.readline()
        create_topic(f"127.0.0.1:{port}", "tried", 1)
        assert produce(f"127.0.0.1:{port}", "tried", [(0, b"k", b"v", None)]) == 1

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "embedded broker stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 10
    while ping(f"127.0.0.1:{port}", timeout_s=0.5) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ping(f"127.0.0.1:{port}", timeout_s=0.5)  # the broker went with the command
