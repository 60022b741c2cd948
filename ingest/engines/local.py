"""The local engine: a batch's ranges turned into data files on this machine.

A batch runs in this process unless it holds two chunks (``batch.chunk_records``) or more, or two
:data:`SHARE_RECORDS` (1M records). A larger one is shared between this process and up to
``batch.workers - 1`` worker processes (:mod:`ingest.engines.workers`), kept for
the following batches of the run. A run opened by :func:`ingest.runner.opened` starts them before
the catalog opens when Kafka shows a backlog that needs them (:func:`workers_for_backlog`); else a
batch starts them when it first needs them. This process starts reading the whole batch at once;
each worker, when it is ready, takes an equal share of what this process has not read yet
(:func:`ingest.engines.tasks.hand_off`). A worker already running therefore gets its share before
anything is read, and one that takes seconds to start cannot hold the batch back. Every share is
read in a background thread while its earlier chunks decode and write, and this process alone
commits, once the shares cover the batch exactly.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from ingest import failpoints
from ingest.config import PipelineConfig
from ingest.core.plan import Batch
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import combine, hand_off, run_task
from ingest.engines.workers import Task, WorkerPool
from ingest.errors import IngestError, WorkerLost
from ingest.kafka.reading import READ_CHUNK_RECORDS, Stops
from ingest.kafka.source import KafkaSource
from ingest.ports import Produced
from ingest.progress import Advanced
from ingest.records import Declared
from ingest.route_by.writing import RoutedTables

if TYPE_CHECKING:  # importing this module loads no pyiceberg: the CLI starts workers before it does
    from ingest.iceberg.table import IcebergTable

log = logging.getLogger(__name__)

#: how long :meth:`LocalEngine.start_workers` waits for a worker's imports
WORKER_READY_TIMEOUT_S = 120.0
#: how long :func:`workers_for_backlog` waits for Kafka: a guess is not worth waiting for
EARLY_GUESS_TIMEOUT_S = 2.0


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


#: records that make a batch of one chunk worth two processes: a worker's start (~0.5 s of
#: imports, on another core) and its ~150 MB (interpreter, Arrow, pyiceberg) pay off from two of
#: these. Spawn to exit on two cores, 1M records: 2.32-2.43 s in one process, 2.03-2.14 s with a
#: worker; 500k: 1.57-1.77 s against 1.51-1.63 s, with both processes together over that batch's
#: memory budget (4 x payload + 400 MB).
SHARE_RECORDS = 500_000


def processes(config: PipelineConfig, records: int | None = None) -> int:
    """How many processes work on a batch of ``records``: one per full chunk (``chunk_records``),
    and two for a batch of one chunk that holds two :data:`SHARE_RECORDS`; at most
    ``batch.workers`` (all of them without ``records``)."""
    workers = available_cores() if config.batch.workers == "auto" else config.batch.workers
    if records is None:
        return workers
    chunks = records // config.batch.chunk_records
    return max(1, min(workers, chunks if chunks >= 2 else min(2, records // SHARE_RECORDS)))


def workers_for_backlog(config: PipelineConfig) -> WorkerPool:
    """The worker pool of a run's local engine, with the workers its first batch will want already
    starting if Kafka shows a backlog that large (:meth:`KafkaSource.backlog`).

    Called before the catalog is opened, as ``ingest run`` does: a worker's imports (a second or
    more on a cold machine) then overlap this process's own imports and the catalog's opening
    instead of the batch. The guess only decides when workers start; the batch is planned from
    the table's ledger, and a worker it does not need is stopped with the engine. Without an
    answer from Kafka, workers start when a batch needs them, and the plan reports the error.
    """
    pool = WorkerPool(processes(config) - 1)
    source = KafkaSource(config.kafka, config.subscription, config.group_id, EARLY_GUESS_TIMEOUT_S)
    try:
        backlog = source.backlog()
    except IngestError as error:
        log.debug("no early workers: %s", error)
        return pool
    helpers = processes(config, min(backlog, config.batch.max_records)) - 1
    log.info(
        "Kafka holds %d records past the offsets of consumer group %r: %d workers start before the catalog opens",
        backlog,
        config.group_id,
        helpers,
    )
    if helpers:
        pool.start(helpers)
    return pool


def _nothing(records: int, nbytes: int, files: int) -> None:
    pass


class LocalEngine:
    """Reads, decodes and writes on this machine, one bounded chunk at a time per process."""

    def __init__(
        self, config: PipelineConfig, rows: IcebergTable | RoutedTables, pool: WorkerPool | None = None
    ) -> None:
        """``pool``: one from :func:`workers_for_backlog`, whose workers may be starting already."""
        self.config = config
        self.rows = rows
        self.workers = processes(config)
        self._pool = pool if pool is not None else WorkerPool(self.workers - 1)

    def start_workers(self, wait: bool = False) -> None:
        """Start the worker processes now rather than when a batch first needs them; with ``wait``,
        return once they are ready, so that the next shared batch is cut in equal shares before
        anything is read."""
        self._pool.start(self.workers - 1, timeout_s=WORKER_READY_TIMEOUT_S if wait else None)

    def processes_for(self, records: int) -> int:
        """How many processes work on a batch of ``records`` (:func:`processes`)."""
        return processes(self.config, records)

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        failpoints.reach("before-read")
        advanced = advanced if advanced is not None else _nothing
        records = sum(end - start for _, start, end in batch.ranges())
        # a changelog batch is folded by one task: no key's changes are split between processes
        helpers = self.processes_for(records) - 1 if self.config.changes is None else 0
        stops = Stops(batch.ranges())
        spec = TaskSpec.of(self.config, fields)
        reached: set[str] = set()
        once = threading.Lock()  # (workers' words come in on the dispatch thread)

        def reach(point: str) -> None:  # each failpoint once, whichever process gets there first
            with once:
                if point in reached:
                    return
                reached.add(point)
            failpoints.reach(point)

        if helpers == 0:
            outputs = [run_task(spec, self.rows, 0, stops, reach, advanced)]
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
                return [Task(spec, detached, next(numbers), ranges) for ranges in shares]

            outputs = self._pool.run(
                helpers, give, reach, advanced, meanwhile=lambda: run_task(spec, self.rows, 0, stops, reach, advanced)
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

    def writing_to(self, rows: IcebergTable | RoutedTables) -> LocalEngine:
        """This engine writing with ``rows`` (see :meth:`ingest.ports.Engine.writing_to`)."""
        engine = copy.copy(self)
        engine.rows = rows
        return engine

    def close(self) -> None:
        """Stop the worker processes (idle ones exit at once)."""
        self._pool.close()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
