"""The one driver of runs: a config's tables, once, until caught up or every interval, until stopped.

``ingest run``, Airflow's ``IngestOperator`` and :func:`ingest.api.run` drive their runs here, so
each gets the same rules:

* one table: its run (pipeline and engine) is opened once and kept for every tick of ``--every``;
  with ``--every`` and ``metrics.port``, ``/metrics`` is served while it runs;
* several tables (``tables:``): each in turn, with the catalog opened once and one Spark session
  for every table's engine; a table that fails does not hold the others back, and once every
  table had its turn the first fatal failure is the run's, else the first (a retry cannot fix a
  fatal one); what a table's batches freed goes back to the system before the next;
* ``every``: a retryable failure is ridden out until the next tick; a fatal one ends the run;
* ``stop`` (SIGTERM): no batch begins once it is set; the batch in flight commits or leaves no trace.

What a caller shows of the run (a terminal's progress, ``--json`` lines, an Airflow task's log and
totals) is a :class:`Watcher`'s; while a table's batches run, the watcher hears how far they are
every ``report_every_s`` (:mod:`ingest.progress`), and the run's metrics are exported with it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ingest import arrow_memory, nogc
from ingest.config import PipelineConfig
from ingest.errors import IngestError, RetryableError
from ingest.progress import Figures
from ingest.runner import EngineChoice, Run, opened

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ingest.batch_result import BatchResult


@dataclass(frozen=True)
class Schedule:
    """How many batches a run commits: one (the default), until the end offsets seen at its start
    are in (``until_caught_up``), or a catch-up every ``every_s`` seconds until stopped; at most
    ``max_batches`` per catch-up."""

    until_caught_up: bool = False
    max_batches: int | None = None
    every_s: float | None = None

    @property
    def catches_up(self) -> bool:
        return self.until_caught_up or self.every_s is not None


class Watcher(Protocol):
    """What a caller does as a run goes (see :mod:`ingest.driver`)."""

    def tick(self, run: Run) -> contextlib.AbstractContextManager[None]:
        """Around one table's batches of one catch-up (``run`` is that table's)."""
        ...

    def batch(self, run: Run, result: BatchResult) -> None:
        """A batch of ``run`` ended: committed, found landed, or nothing to do."""
        ...

    def progress(self, run: Run, figures: Figures) -> None:
        """How far ``run``'s catch-up is, every ``report_every_s`` while its batches run."""
        ...

    def failed(self, config: PipelineConfig, error: Exception) -> None:
        """A table of several failed; the others still get their turn."""
        ...

    def retrying(self, why: str, every_s: float) -> None:
        """A catch-up of ``every`` failed retryably (``why``); the next tick tries again."""
        ...


class Collected:
    """A watcher that keeps every batch's result (:func:`ingest.api.run`)."""

    def __init__(self) -> None:
        self.results: list[BatchResult] = []

    @contextlib.contextmanager
    def tick(self, run: Run) -> Iterator[None]:
        yield

    def batch(self, run: Run, result: BatchResult) -> None:
        self.results.append(result)

    def progress(self, run: Run, figures: Figures) -> None:
        log.info("%s", figures.text(), extra={"progress": figures.as_dict()})

    def failed(self, config: PipelineConfig, error: Exception) -> None:
        log.warning("%s failed (%s): %s", config.table, type(error).__name__, error)

    def retrying(self, why: str, every_s: float) -> None:
        log.warning("retryable %s; next try in %.0fs", why, every_s)


#: how often a run's progress is reported while its batches run (a log line, the metrics' export)
REPORT_EVERY_S = 30.0


def first_failure(failures: Sequence[Exception]) -> Exception:
    """The failure a run of several tables ends with: the first fatal one, else the first."""
    return next((error for error in failures if not _retryable(error)), failures[0])


def drive(
    configs: Sequence[PipelineConfig],
    watcher: Watcher,
    schedule: Schedule = Schedule(),
    engine: EngineChoice = "local",
    stop: threading.Event | None = None,
    report_every_s: float = REPORT_EVERY_S,
    lineage: bool = True,
) -> None:
    """Run ``configs``' tables on ``engine`` as ``schedule`` says, until done or ``stop`` is set;
    ``watcher`` hears how far each table's batches are every ``report_every_s``. ``lineage=False``:
    no OpenLineage events (Airflow's provider sends the task's own)."""
    stop = stop if stop is not None else threading.Event()
    watching = _Watching(watcher, report_every_s, lineage)
    if len(configs) == 1:
        _one(configs[0], watching, schedule, engine, stop)
    else:
        _several(configs, watching, schedule, engine, stop)


@dataclass(frozen=True)
class _Watching:
    watcher: Watcher
    every_s: float
    lineage: bool


def _one(
    config: PipelineConfig, watching: _Watching, schedule: Schedule, engine: EngineChoice, stop: threading.Event
) -> None:
    with running(config, engine, lineage=watching.lineage) as run:  # one engine (one Spark session) for every batch
        if schedule.every_s is not None and run.metrics is not None and run.metrics.spec.port is not None:
            run.metrics.serve()  # /metrics while it runs; each tick's values as it ends
        while not stop.is_set():
            started = time.monotonic()
            try:
                _catch_up(run, watching, schedule, stop)
            except RetryableError as error:
                if schedule.every_s is None:
                    raise
                # a long-running loop rides out what the next tick can fix; fatal errors stop it
                watching.watcher.retrying(f"({type(error).__name__}): {error}", schedule.every_s)
            if schedule.every_s is None:
                return
            stop.wait(max(0.0, schedule.every_s - (time.monotonic() - started)))


def _several(
    configs: Sequence[PipelineConfig],
    watching: _Watching,
    schedule: Schedule,
    engine: EngineChoice,
    stop: threading.Event,
) -> None:
    from ingest.iceberg.sharing import shared

    with contextlib.ExitStack() as spark, shared():  # the catalog opened once for every table
        # one Spark session for every table's engine: an engine stops only the session it built
        session = None
        if engine == "spark":
            from ingest.engines.spark import shared_session

            session = spark.enter_context(shared_session())
        for tick in itertools.count():
            if stop.is_set():
                return
            started = time.monotonic()
            failures: list[Exception] = []
            for index, config in enumerate(configs):
                if stop.is_set():
                    break
                try:
                    first = tick == 0 and index == 0
                    with running(config, engine, session, first=first, lineage=watching.lineage) as run:
                        _catch_up(run, watching, schedule, stop)
                except Exception as error:  # the other tables still get their turn
                    failures.append(error)
                    watching.watcher.failed(config, error)
                finally:
                    arrow_memory.release()  # what this table's batches freed, back to the system for the next
            every = schedule.every_s
            if failures and (every is None or any(not _retryable(error) for error in failures)):
                raise first_failure(failures)
            if every is None:
                return
            if failures:
                watching.watcher.retrying(f"{len(failures)} of {len(configs)} tables failed", every)
            stop.wait(max(0.0, every - (time.monotonic() - started)))


def _catch_up(run: Run, watching: _Watching, schedule: Schedule, stop: threading.Event) -> None:
    """One table's batches of one tick; no batch begins once ``stop`` is set."""
    watcher = watching.watcher
    with watcher.tick(run), _reporting(run, watching):
        for result in run.batches(until_caught_up=schedule.catches_up, max_batches=schedule.max_batches):
            watcher.batch(run, result)
            if stop.is_set():
                return


@contextlib.contextmanager
def _reporting(run: Run, watching: _Watching) -> Iterator[None]:
    """While the block runs: every ``every_s``, the watcher hears how far ``run`` is, and its
    metrics are exported with the batch in flight's figures (from a thread of its own)."""
    done = threading.Event()

    def report() -> None:
        while not done.wait(watching.every_s):
            figures = run.progress.figures()
            try:
                watching.watcher.progress(run, figures)
                if run.metrics is not None:
                    run.metrics.progressed(figures, run.progress.left())
            except Exception:  # a report is never worth a run: say so, go on
                log.warning("could not report the run's progress", exc_info=True)

    thread = threading.Thread(target=report, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def running(
    config: PipelineConfig,
    engine: EngineChoice = "local",
    spark: object = None,
    first: bool = True,
    lineage: bool = True,
) -> Iterator[Run]:
    """The run of ``config`` (:func:`ingest.runner.opened`), its start's garbage frozen once open; the
    local engine's workers start before pyiceberg is imported (``first``: for the run's first table)."""
    try:
        with opened(config, engine, spark=spark, early_workers=first, lineage=lineage) as run:  # type: ignore[arg-type]
            nogc.started()
            yield run
    finally:
        nogc.started(freeze=False)  # (a run that could not open: `--every` may go on for hours)


def _retryable(error: Exception) -> bool:
    return isinstance(error, IngestError) and error.retryable
