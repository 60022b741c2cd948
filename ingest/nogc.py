"""Python's cyclic garbage collector paused around bulk work.

A batch allocates millions of short-lived container objects that form no reference cycles: a
confluent-kafka ``Message`` per record (GC-tracked), and pydantic models by the hundred thousand
each time pyiceberg loads or copies a table's metadata. The collector runs every 700 such
allocations and, every so often, walks every live tracked object; in a process reading a batch
that cost a third of its CPU (the measurements: docs/performance.md).

Reference counting frees everything as usual while the collector is paused; only garbage in
cycles waits until the pause ends. Mercurial's ``util.nogc`` does the same around its bulk
parsing. The pause is process-wide, so it nests and is shared between threads: the collector
runs again when the last pause ends, and only if it was enabled when the first began.

The ``ingest`` command also starts with the collector off (:func:`pause_startup`): importing
pyiceberg, SQLAlchemy and pydantic builds a few hundred thousand objects, none of them garbage,
and the collections they set off cost ~150 ms of a run's start. Once the run is open
(:func:`started`) what the imports built is frozen out of the collector's walks and it runs again.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_resume = False
#: the collector is off for the start of the ``ingest`` command (:func:`pause_startup`)
_startup = False


def pause_startup() -> None:
    """No automatic cyclic garbage collection until :func:`started` (the ``ingest`` command's start)."""
    global _startup
    with _lock:
        if gc.isenabled():
            gc.disable()
            _startup = True


def started(*, freeze: bool = True) -> None:
    """The start is over: what exists now is frozen (never walked again; not with ``freeze=False``,
    as after a start that failed) and the collector runs again, or when the pauses under way end."""
    global _startup, _resume
    with _lock:
        if not _startup:
            return
        _startup = False
        if freeze:
            gc.freeze()
        if _depth == 0:
            gc.enable()
        else:
            _resume = True


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic cyclic garbage collection in this process while the block runs."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
