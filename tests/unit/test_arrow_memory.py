"""The data path's Arrow memory pool (ingest.arrow_memory). The default pool is process-wide, so
each case runs in a new interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

PROBE = (
    "import pyarrow as pa; from ingest.arrow_memory import use_jemalloc; "
    "before = pa.default_memory_pool().backend_name; chosen = use_jemalloc(); "
    "print(before, chosen, use_jemalloc(), pa.default_memory_pool().backend_name)"
)


def _probe(**env: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | env
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=environment, check=True)
    return done.stdout.split()


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


@pytest.mark.skipif(not _has_jemalloc(), reason="this pyarrow build has no jemalloc pool")
def test_jemalloc_replaces_the_default_pool() -> None:
    _, chosen, again, now = _probe()  # pyarrow's own default is mimalloc
    assert chosen == again == now == "jemalloc"


def test_a_pool_the_user_named_is_kept() -> None:
    assert _probe(ARROW_DEFAULT_MEMORY_POOL="system") == ["system"] * 4
