"""The local engine: a batch's ranges turned into data files on this machine.

A batch of fewer than two chunks (``batch.chunk_records``) runs in this process. A larger one is
shared out (:func:`ingest.tasks.share`: near-equal offset counts) between this process and up to
``batch.workers - 1`` worker processes (:mod:`ingest.workers`), started when a batch first needs
them and kept for the following batches of the run. Either way every share is read in a
background thread while its earlier chunks decode and write, and this process alone commits.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType

from ingest import failpoints
from ingest.config import PipelineConfig
from ingest.core.plan import Batch
from ingest.iceberg import IcebergTable
from ingest.tasks import Produced, combine, run_task, share
from ingest.workers import WorkerLost, WorkerPool

log = logging.getLogger(__name__)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class LocalEngine:
    """Reads, decodes and writes on this machine, one bounded chunk at a time per process."""

    def __init__(self, config: PipelineConfig, rows: IcebergTable) -> None:
        self.config = config
        self.rows = rows
        workers = config.batch.workers
        self.workers = available_cores() if workers == "auto" else workers
        self._pool = WorkerPool(self.workers - 1)

    def processes_for(self, records: int) -> int:
        """How many processes work on a batch of ``records``: one per full chunk, at most ``workers``."""
        return max(1, min(self.workers, records // self.config.batch.chunk_records))

    def produce(self, batch: Batch) -> Produced:
        failpoints.reach("before-read")
        records = sum(end - start for _, start, end in batch.ranges())
        groups = share(batch.ranges(), self.processes_for(records))
        reached: set[str] = set()

        def reach(point: str) -> None:  # each failpoint once, whichever process gets there first
            if point not in reached:
                reached.add(point)
                failpoints.reach(point)

        if len(groups) <= 1:
            outputs = [run_task(self.config, self.rows, 0, groups[0] if groups else [], reach)]
        else:
            log.info(
                "batch %d: %d records shared between this process and %d workers",
                batch.number,
                records,
                len(groups) - 1,
            )
            detached = self.rows.detached()
            outputs = self._pool.run(
                [(self.config, detached, i, group) for i, group in enumerate(groups) if i > 0],
                reach,
                meanwhile=lambda: run_task(self.config, self.rows, 0, groups[0], reach),
            )
        produced = combine(len(groups) or 1, outputs, lambda problem: WorkerLost(f"the local engine {problem}"))
        failpoints.reach("files-written")
        return produced

    def close(self) -> None:
        """Stop the worker processes (idle ones exit at once)."""
        self._pool.close()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
