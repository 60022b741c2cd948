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
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_resume = False


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
