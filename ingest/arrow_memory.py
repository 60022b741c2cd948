"""Arrow's memory pool for the data path: jemalloc where this pyarrow build has it.

pyarrow's default pool is mimalloc. A batch's Arrow buffers (JSON parse, columns, Parquet pages)
are allocated afresh in a new process, on transparent huge pages that the kernel zeroes 2 MB at
a time. With jemalloc's pool the first batch of a run is faster and smaller; later batches, on
warm pools, are alike (the measurements: docs/performance.md).

A pool named in ``ARROW_DEFAULT_MEMORY_POOL`` is the user's choice and is kept. Buffers remember
the pool that allocated them, so switching the default while others exist is safe.

:func:`release` hands what a finished run freed back to the system, for the next run of the
same process (the next table of a config of several).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

import pyarrow as pa

log = logging.getLogger(__name__)


@functools.cache
def use_jemalloc() -> str:
    """Make jemalloc this process's default Arrow pool, unless ``ARROW_DEFAULT_MEMORY_POOL``
    names one or this build lacks it; returns the backend in use. Idempotent."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # pyarrow built without jemalloc (Windows, some platforms)
            log.debug("pyarrow has no jemalloc pool here; keeping %s", pa.default_memory_pool().backend_name)
    return str(pa.default_memory_pool().backend_name)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc's


def release() -> None:
    """Return freed memory to the system: Arrow's unused pool memory, and what glibc's malloc keeps
    in its arenas after librdkafka's and Python's frees (a run of 50 tables in one process grew
    from 390 MB after its first table to 530-670 MB after each of the others; trimmed, 280-360 MB)."""
    pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
