"""Named points in a batch where the crash-safety tests kill the process for real.

``INGEST_FAILPOINT=<name>`` makes the process SIGKILL itself when it reaches that point, exactly
as an OOM killer or a killed Airflow task would: no cleanup, no ``finally``, no flush. Unset (the
normal case) it costs one dict lookup per point. ``INGEST_WORKER_FAILPOINT=<name>`` does the same
in the local engine's worker processes (``mid-read``, ``mid-write``), as the OOM killer would.
"""

from __future__ import annotations

import os
import signal

POINTS = ("before-read", "mid-read", "mid-write", "files-written", "between-commits", "after-commit")


def reach(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("INGEST_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def reach_in_worker(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("INGEST_WORKER_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
