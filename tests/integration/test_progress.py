"""A run seen while it runs: the live display on a terminal (a real pseudo terminal), progress log
lines off one (text and JSON), and the metrics textfile rewritten after each batch, over Apache
Kafka and a SQLite catalog."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import REPO, Env, MakeEnv

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def _small_batches(env: Env, records: int, **changes: Any) -> None:
    """``records`` to catch up with, in batches of 100 chunks of 50: many batches, each a few chunks."""
    data = yaml.safe_load(env.config_path.read_text())
    env.config_path.write_text(
        yaml.safe_dump({**data, "batch": {"max_records": 100, "chunk_records": 50, "workers": 1}, **changes})
    )
    env.produce(records, bad_every=7)


def test_a_catch_up_on_a_terminal_shows_its_progress_live(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    _small_batches(env, 1_500)
    primary, secondary = pty.openpty()
    run = subprocess.Popen(
        [sys.executable, "-m", "ingest", "run", "--until-caught-up", "-c", str(env.config_path)],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"},
        cwd=REPO,
    )
    os.close(secondary)
    shown = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other end closed: the run is over
                break
            if not chunk:
                break
            shown += chunk
        elif run.poll() is not None:
            break
    os.close(primary)
    assert run.wait(60) == 0, shown.decode(errors="replace")
    text = ANSI.sub("", shown.decode(errors="replace"))

    assert "\x1b[" in shown.decode(errors="replace")  # drawn and redrawn in place, as a live display is
    assert re.search(rf"orders → {re.escape(env.config.table)}", text), text
    assert re.search(r"records/s", text) and "ETA" in text and "lag left" in text, text
    # inside a batch: what it planned, read, decoded and wrote so far
    assert re.search(r"batch \d+ .*of 100 read · \d+ chunks? decoded · \d+ files? written", text), text
    assert "batch 15: committed" in text  # each batch's line above the display
    env.verify()


def test_a_catch_up_off_a_terminal_logs_a_progress_line_at_each_interval(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    _small_batches(env, 1_500)
    text = env.cli("run", "--until-caught-up", "--progress-every", "0.3s")
    assert text.returncode == 0, text.stderr
    lines = [line for line in text.stderr.splitlines() if "records/s" in line]
    assert lines, text.stderr
    assert re.search(r"orders: [\d,]+ records \([\d.,]+ MB\) in \d+:\d\d; [\d,]+ records/s; lag [\d,]+; ETA", lines[0])

    env.produce(1_500, bad_every=7)
    logged = env.cli("run", "--until-caught-up", "--progress-every", "0.3s", "--log-format", "json")
    assert logged.returncode == 0, logged.stderr
    documents = [json.loads(line) for line in logged.stderr.splitlines() if line.startswith("{")]
    progress = [d["progress"] for d in documents if "progress" in d]
    assert progress, logged.stderr
    assert {"records", "bytes", "records_per_s", "lag", "eta_s", "batch", "batch_planned", "batch_done"} <= set(
        progress[0]
    )
    assert set(progress[-1]["lag"]) == {env.topic}
    assert all(a["records"] <= b["records"] for a, b in itertools.pairwise(progress))

    env.produce(300)
    quiet = env.cli("run", "--until-caught-up", "--progress-every", "0.1s", "-q")
    assert quiet.returncode == 0 and "records/s" not in quiet.stderr, quiet.stderr
    env.verify()


def _samples(path: Path) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
        if "partition" not in sample.labels and "status" not in sample.labels and "reason" not in sample.labels
    }


def test_the_metrics_textfile_is_rewritten_after_each_batch_while_the_run_goes_on(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    env = make_env(partitions=1)
    textfile = tmp_path / "ingest.prom"
    _small_batches(env, 1_000, metrics={"textfile": str(textfile)})
    # the run holds still before its fourth batch reads (SIGSTOP), as a long catch-up is seen midway
    run = env.popen("run", "--until-caught-up", env={"INGEST_FAILPOINT": "before-read#4:stop"})
    try:
        deadline = time.monotonic() + 120
        while not _stopped(run.pid):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.1)
        midway = _samples(textfile)
        assert midway["ingest_records_total"] + midway["ingest_dead_letters_total"] == 300  # three batches
        assert "ingest_last_success_timestamp_seconds" not in midway  # the run has not ended
        assert midway["ingest_batch_planned_records"] == 0  # exported between batches
        assert midway["ingest_catch_up_eta_seconds"] >= 0
        assert not any(name.endswith("_created") for name in midway), sorted(midway)
        lag = [s for f in text_string_to_metric_families(textfile.read_text()) for s in f.samples
               if s.name == "ingest_lag_records"]  # fmt: skip
        assert [s.value for s in lag] == [700]
    finally:
        run.send_signal(signal.SIGCONT)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    done = _samples(textfile)
    assert done["ingest_records_total"] + done["ingest_dead_letters_total"] == 1_000
    assert "ingest_last_success_timestamp_seconds" in done
    env.verify()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"
