"""Prometheus metrics of the runs (``metrics:``): a node_exporter textfile, a real Prometheus
Pushgateway (Debian's, installed by ``make services``, started here on a free port), and
``/metrics`` while ``ingest run --every`` runs."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingest.kafka.embedded import free_port
from tests import strict
from tests.integration.conftest import MakeEnv

from .conftest import Env

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        strict.missing("prometheus-pushgateway is not installed: `make services` installs Debian's")
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", f"--persistence.file={tmp_path / 'push.db'}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the Pushgateway did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def _with(env: Env, **changes: Any) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    env.config_path.write_text(yaml.safe_dump({**data, **changes}))


def test_a_run_exports_its_counts_lag_and_freshness_and_a_failure_keeps_the_last_success(
    make_env: MakeEnv, pushgateway: str, tmp_path: Path
) -> None:
    env = make_env(partitions=2)
    textfile = tmp_path / "ingest_orders.prom"
    _with(env, metrics={"textfile": str(textfile), "pushgateway": pushgateway})
    env.produce(30, bad_every=6)

    assert env.cli("run", "--until-caught-up").returncode == 0

    run = _samples(textfile.read_text())
    assert _value(run, "ingest_records_total", pipeline="orders") == 25
    assert _value(run, "ingest_dead_letters_total", pipeline="orders") == 5
    assert _value(run, "ingest_batches_total", status="committed") == 1
    for reason in ("conflict", "unknown", "fenced"):  # no other writer, no fault: none
        assert _value(run, "ingest_commit_retries_total", reason=reason) == 0
    assert [_value(run, "ingest_lag_records", partition=str(p)) for p in (0, 1)] == [0, 0]
    produced_at = _value(run, "ingest_valid_through_timestamp_seconds")  # Kafka timestamps: when produced
    assert produced_at is not None and abs(produced_at - time.time()) < 300
    succeeded = _value(run, "ingest_last_success_timestamp_seconds")
    assert succeeded is not None and abs(succeeded - time.time()) < 120
    pushed = _samples(urllib.request.urlopen(f"{pushgateway}/metrics", timeout=5).read().decode())
    assert _value(pushed, "ingest_records_total", job="ingest", pipeline="orders") == 25
    assert _value(pushed, "ingest_last_success_timestamp_seconds", outcome="success") == succeeded

    _with(env, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})  # the broker is gone
    assert env.cli("run").returncode == 75

    after = _samples(textfile.read_text())
    assert _value(after, "ingest_last_success_timestamp_seconds") == succeeded  # kept
    failed = _value(after, "ingest_last_failure_timestamp_seconds")
    assert failed is not None and failed >= succeeded
    assert _value(after, "ingest_valid_through_timestamp_seconds") == produced_at  # what is known stays
    assert _value(after, "ingest_lag_records", partition="1") == 0
    pushed = _samples(urllib.request.urlopen(f"{pushgateway}/metrics", timeout=5).read().decode())
    assert _value(pushed, "ingest_last_success_timestamp_seconds", outcome="success") == succeeded
    assert _value(pushed, "ingest_last_failure_timestamp_seconds", outcome="failure") == failed
    assert _value(pushed, "ingest_valid_through_timestamp_seconds", job="ingest") == produced_at
    assert _value(pushed, "ingest_records_total", job="ingest") == 25  # the failed run did not replace it


def test_run_every_serves_metrics_while_it_runs(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    port = free_port()
    _with(env, metrics={"port": port})
    env.produce(20)
    running = env.popen("run", "--every", "1s")
    try:
        seen: list[float | None] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                seen.append(_value(_samples(text), "ingest_records_total", pipeline="orders"))
            except OSError:
                pass
            if seen and seen[-1] == 20 and env.produced == 20:
                env.produce(10)  # the next tick takes these
            if seen and seen[-1] == 30:
                break
            time.sleep(0.5)
        assert seen and seen[-1] == 30, seen
    finally:
        running.send_signal(signal.SIGTERM)
        running.communicate(timeout=60)
    assert running.returncode == 143
