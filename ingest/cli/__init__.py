"""The ``ingest`` command line: rich output for people, ``--json`` for machines.

Exit codes (see :class:`ingest.errors.ExitCode`): 0 success, 75 retryable failure, 65 fatal
failure (data loss, ledger lost, verification failed), 78 configuration error, 1 internal error.

The application and what its commands share are in :mod:`~ingest.cli.common`; ``ingest run`` in
:mod:`~ingest.cli.running`; the commands on a pipeline's tables in :mod:`~ingest.cli.tables`; ``ingest demo``
and ``ingest broker`` in :mod:`~ingest.cli.local`; ``ingest init`` and ``ingest config-schema`` in
:mod:`~ingest.cli.starting`.
"""

from __future__ import annotations

import sys

from ingest.cli import local, running, starting, tables
from ingest.cli.common import app, err
from ingest.errors import ExitCode

__all__ = ["app", "local", "main", "running", "starting", "tables"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted: nothing half-committed is visible; run again to continue")
        sys.exit(130)
    except SystemExit:
        raise
    except BaseException:
        err.print_exception()
        sys.exit(int(ExitCode.INTERNAL))
