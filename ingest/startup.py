"""The start of a process of ours, the ``ingest`` command or a local-engine worker: what it sets
before its imports. They end with :func:`ingest.nogc.started`."""

from __future__ import annotations

import os

from ingest import nogc

#: numpy's OpenBLAS starts a thread per core when it is loaded, and those threads spin a while
#: before they sleep. Nothing here calls BLAS; beside the other process's imports the spinning cost a
#: caught-up ``ingest run`` 15% of its CPU (850 -> 725 ms). One thread, unless the environment says.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")


def begin() -> None:
    """Before the imports: one BLAS thread (unless set), and the garbage collector paused
    (:func:`ingest.nogc.pause_startup`)."""
    os.environ.setdefault(*BLAS_THREADS)
    nogc.pause_startup()
