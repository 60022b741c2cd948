"""The crash tests' failpoints in a process of their own: SIGKILL at the armed point and its n-th
reach, or SIGSTOP there (``:stop``) until a SIGCONT, going on from the very point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REACH_TWICE = """
from ingest import failpoints
failpoints.reach("files-written")
print("after the first", flush=True)
failpoints.reach("files-written")
print("after the second", flush=True)
"""


def _start(armed: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", REACH_TWICE],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "INGEST_FAILPOINT": armed},
    )


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_armed_failpoint_kills_the_process_at_the_nth_reach() -> None:
    process = _start("files-written#2")
    out, _ = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert out == "after the first\n"


def test_a_failpoint_armed_to_stop_pauses_the_process_there_until_it_is_continued() -> None:
    process = _start("files-written#1:stop")
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while _state(process.pid) != "T":
        assert process.poll() is None and time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.02)

    process.send_signal(signal.SIGCONT)
    out, _ = process.communicate(timeout=60)

    assert process.returncode == 0
    assert out == "after the first\nafter the second\n"
