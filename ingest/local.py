"""The local engine: a batch's ranges turned into data files on this machine.

A batch of fewer than two chunks (``batch.chunk_records``) runs in this process. A larger one is
shared between this process and up to ``batch.workers - 1`` worker processes (:mod:`ingest.workers`),
started when a batch first needs them and kept for the following batches of the run. This process
starts reading the whole batch at once; each worker, when it is ready, takes an equal share of
what this process has not read yet (:func:`ingest.tasks.hand_off`). A worker already running
therefore gets its share before anything is read, and one that takes seconds to start cannot hold
the batch back. Every share is read in a background thread while its earlier chunks decode and
write, and this process alone commits, once the shares cover the batch exactly.
"""

from __future__ import annotations

import itertools
import logging
import os
from types import TracebackType

from ingest import failpoints
from ingest.config import PipelineConfig
from ingest.core.plan import Batch
from ingest.iceberg import IcebergTable
from ingest.kafka import READ_CHUNK_RECORDS, Stops
from ingest.tasks import Produced, combine, hand_off, run_task
from ingest.workers import Task, WorkerLost, WorkerPool

log = logging.getLogger(__name__)

#: how long :meth:`LocalEngine.start_workers` waits for a worker's imports
WORKER_READY_TIMEOUT_S = 120.0


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

    def start_workers(self, wait: bool = False) -> None:
        """Start the worker processes now rather than when a batch first needs them; with ``wait``,
        return once they are ready, so that the next shared batch is cut in equal shares before
        anything is read."""
        self._pool.start(self.workers - 1, timeout_s=WORKER_READY_TIMEOUT_S if wait else None)

    def processes_for(self, records: int) -> int:
        """How many processes work on a batch of ``records``: one per full chunk, at most ``workers``."""
        return max(1, min(self.workers, records // self.config.batch.chunk_records))

    def produce(self, batch: Batch) -> Produced:
        failpoints.reach("before-read")
        records = sum(end - start for _, start, end in batch.ranges())
        helpers = self.processes_for(records) - 1
        stops = Stops(batch.ranges())
        reached: set[str] = set()

        def reach(point: str) -> None:  # each failpoint once, whichever process gets there first
            if point not in reached:
                reached.add(point)
                failpoints.reach(point)

        if helpers == 0:
            outputs = [run_task(self.config, self.rows, 0, stops, reach)]
        else:
            log.info(
                "batch %d: reading %d records in this process, %d workers joining as they are ready",
                batch.number,
                records,
                helpers,
            )
            detached = self.rows.detached()
            numbers = itertools.count(1)
            least = min(self.config.batch.chunk_records, READ_CHUNK_RECORDS)  # less is not worth a consumer

            def give(parts: int) -> list[Task]:
                shares = hand_off(stops, parts, least)
                return [Task(self.config, detached, next(numbers), ranges) for ranges in shares]

            outputs = self._pool.run(
                helpers, give, reach, meanwhile=lambda: run_task(self.config, self.rows, 0, stops, reach)
            )
            shared = sum(end - start for output in outputs[1:] for _, start, end in output.ranges)
            log.info(
                "batch %d: %d records shared between this process and %d workers (%d read by the workers)",
                batch.number,
                records,
                len(outputs) - 1,
                shared,
            )
        produced = combine(batch.ranges(), outputs, lambda problem: WorkerLost(f"the local engine {problem}"))
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
