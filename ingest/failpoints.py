"""Named points in a batch where the crash-safety tests kill the process for real.

``INGEST_FAILPOINT=<name>`` makes the process SIGKILL itself when it reaches that point, exactly
as an OOM killer or a killed Airflow task would: no cleanup, no ``finally``, no flush;
``<name>#<n>`` when it reaches it the n-th time (a config of several tables reaches each point once
per table's batch). Unset (the normal case) it costs one dict lookup per point.

``INGEST_WORKER_FAILPOINT=<name>`` does the same in the local engine's worker processes
(``mid-read``, ``mid-write``), as the OOM killer would.

``<name>[#<n>]:stop`` makes the process SIGSTOP itself there instead: it waits at that point until a
SIGCONT, as a process the scheduler or a long pause held would, while a test runs another copy.
"""

from __future__ import annotations

import collections
import os
import signal

POINTS = ("before-read", "mid-read", "mid-write", "files-written", "between-commits", "after-commit")
#: points in the operations around the batch: a rollback or publish after the rows table moved
#: and before the dead-letter table followed
OPERATIONS = ("between-tables",)
#: ``route_by``: after each routed table's commit, before the next one's and the ledger's
ROUTES = ("after-table",)


#: the variable naming the point for the ``ingest`` process, and for the local engine's workers
ENGINE, WORKER = "INGEST_FAILPOINT", "INGEST_WORKER_FAILPOINT"


_reached: collections.Counter[str] = collections.Counter()


def reach(name: str, variable: str = ENGINE) -> None:
    assert name in POINTS or name in OPERATIONS or name in ROUTES, name
    armed = os.environ.get(variable)
    if armed is None or not armed.startswith(name):
        return
    _reached[name] += 1
    point, _, action = armed.partition(":")
    assert action in ("", "stop"), armed
    if point == name or point == f"{name}#{_reached[name]}":
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)
