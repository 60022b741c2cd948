"""Arrow's memory pool for the data path: jemalloc where this pyarrow build has it.

pyarrow's default pool is mimalloc. A batch's Arrow buffers (JSON parse, columns, Parquet pages)
are allocated afresh in a new process, on transparent huge pages that the kernel zeroes 2 MB at
a time: 5.4% of the CPU samples of ``ingest run`` on ``make bench``'s 2M records (``perf``), half of
them under mimalloc's page setup.
With jemalloc's pool, the first batch of a run was faster in each of nine alternating pairs
(404-449k records/s against 378-431k; medians 437k and 414k) and peak RSS fell from 983-1,028 MB
to 917-927 MB; later batches, on warm pools, were within the noise.

A pool named in ``ARROW_DEFAULT_MEMORY_POOL`` is the user's choice and is kept. Buffers remember
the pool that allocated them, so switching the default while others exist is safe.
"""

from __future__ import annotations

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
