"""``ingest`` and ``python -m ingest``: the command line (:mod:`ingest.cli`), its imports made with
the garbage collector paused (:func:`ingest.nogc.pause_startup`) and with one BLAS thread
(:data:`ingest.engines.workers.BLAS_THREADS`)."""

import os

from ingest import nogc
from ingest.engines.workers import BLAS_THREADS


def main() -> None:
    os.environ.setdefault(*BLAS_THREADS)  # before numpy is imported; the workers inherit it
    nogc.pause_startup()
    from ingest.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
