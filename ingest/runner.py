"""The one place a run is assembled: a config and an engine choice become a pipeline and its engine.

``ingest run``, ``ingest replay``, the demo, Airflow's ``IngestOperator`` and the benchmark all open
their runs here, so every run gets the same things in the same order:

* the local engine's worker processes the first batch will want start first, before the catalog
  opens and before pyiceberg is imported, when Kafka shows a backlog that needs them
  (:func:`ingest.engines.local.workers_for_backlog`); their imports then overlap this process's own;
* then the pipeline's tables and Kafka source (:func:`ingest.assembly.open_pipeline`);
* then the engine, kept for every batch of the run (one worker pool, one Spark session) and closed
  when the run ends, whatever ends it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ingest.config import PipelineConfig
from ingest.config.lineage_spec import configured
from ingest.core.ledger import TopicPartition
from ingest.engines.local import LocalEngine, workers_for_backlog
from ingest.errors import IngestError
from ingest.ports import Engine, TableShape
from ingest.progress import Progress

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # importing this module loads no pyiceberg: workers start before it is
    from ingest.assembly import Opened
    from ingest.batch_result import BatchResult
    from ingest.engines.spark import SparkSession
    from ingest.lineage import RunLineage
    from ingest.metrics import RunMetrics

EngineChoice = Literal["local", "spark"]


@dataclass(frozen=True)
class Run:
    """A pipeline and the engine that produces its batches, for as long as the run is open."""

    pipeline: Opened
    engine: Engine
    #: the runs' Prometheus metrics (``metrics:``), exported after each batch of :meth:`batches`
    #: and as each call of it ends
    metrics: RunMetrics | None = None
    #: how far the run is, while it runs (:mod:`ingest.progress`)
    progress: Progress = field(default_factory=lambda: Progress("", ""))
    #: the runs' OpenLineage events (:mod:`ingest.lineage`), when a destination is configured
    lineage: RunLineage | None = None

    def batch(self) -> BatchResult:
        """Plan and commit one batch."""
        return self.pipeline.run_batch(self.engine, self.progress)

    def batches(self, *, until_caught_up: bool = True, max_batches: int | None = None) -> Iterator[BatchResult]:
        """Batches until the ledger reaches the end offsets Kafka showed at start (or ``max_batches``).
        A caller that stops taking them (SIGTERM between batches) ends the run well: each batch that
        began committed or left no trace."""
        batches = self.pipeline.run(
            self.engine, until_caught_up=until_caught_up, max_batches=max_batches, progress=self.progress
        )
        if self.lineage is not None:
            self.lineage.started()
        results: list[BatchResult] = []
        ok = False
        try:
            for result in batches:
                results.append(result)
                if self.metrics is not None:
                    self._count(result)
                try:
                    yield result
                except GeneratorExit:
                    ok = True
                    raise
            ok = True
        except Exception as error:
            if self.lineage is not None:
                self.lineage.failed_with(error, results)
            raise
        finally:
            if ok and self.lineage is not None:
                self.lineage.completed(results)
            if self.metrics is not None:  # (after the lineage: its failures are counted)
                self.metrics.ended(ok, *_where(self.pipeline))

    def _count(self, result: BatchResult) -> None:
        assert self.metrics is not None
        self.metrics.batch(
            result.status,
            result.records,
            result.dead_letters,
            result.bytes,
            result.unknown_fields,
            result.seconds,
            result.retries,
        )
        if result.status != "empty":  # a long catch-up is seen batch by batch, not when it ends
            self.metrics.progressed(self.progress.figures(), self.progress.left())

    def on_branch(self, branch: str) -> Run:
        """The same run committing to ``branch`` (a replay's), with the same engine writing with the
        branch's handle: data files go to the table's location whatever branch commits them. A
        replay's batches are not the pipeline's runs: no metrics."""
        on_branch = self.pipeline.on_branch(branch)
        return Run(on_branch, self.engine.writing_to(on_branch.rows), progress=_progress(on_branch.config))


def _where(pipeline: Opened) -> tuple[dict[TopicPartition, int] | None, int | None]:
    """Each partition's lag and the data's valid-through, for the metrics; each None when Kafka or
    the table cannot say now (a failing run's cause, most likely)."""
    try:
        found = pipeline.ledger()
    except IngestError as error:
        log.warning("metrics: the ledger is unknown (%s)", error)
        return None, None
    committed = found.ledger.offsets if found is not None else {}
    valid_through = found.ledger.valid_through if found is not None else None
    try:
        view = pipeline.source.describe()
    except IngestError as error:
        log.warning("metrics: the lag is unknown (%s)", error)
        return None, valid_through
    return {tp: wm.high - committed.get(tp, wm.low) for tp, wm in view.partitions.items()}, valid_through


def _progress(config: PipelineConfig) -> Progress:
    return Progress(config.pipeline, config.table)


def _lineage(pipeline: Opened, metrics: RunMetrics | None) -> RunLineage | None:
    """The run's OpenLineage events, when a destination is configured (``lineage:``, ``OPENLINEAGE_URL``, …)."""
    if not configured(pipeline.config.lineage):
        return None  # (and the client, ~0.2 s of imports, is not imported)
    from ingest.lineage import RunLineage

    def shapes() -> tuple[TableShape, TableShape | None]:
        return pipeline.rows.shape(), pipeline.dead.shape()

    return RunLineage.of(pipeline.config, shapes, metrics.lineage_failed if metrics is not None else lambda: None)


def _metrics(config: PipelineConfig) -> RunMetrics | None:
    if config.metrics is None:
        return None
    from ingest.metrics import RunMetrics

    return RunMetrics(config.metrics, config.pipeline, config.table)


@contextlib.contextmanager
def opened(
    config: PipelineConfig,
    engine: EngineChoice = "local",
    *,
    spark: SparkSession | None = None,
    early_workers: bool = True,
    lineage: bool = True,
) -> Iterator[Run]:
    """The run of ``config`` on ``engine``: ``"local"`` (this machine's cores) or ``"spark"`` (on
    ``spark``, else the active session, else one built from the usual Spark settings).
    ``early_workers=False``: the local engine's workers start when a batch needs them, never on a
    guess of the backlog (the tables after the first of a run of several: nothing left to overlap).
    ``lineage=False``: no OpenLineage events (Airflow's provider sends the task's own)."""
    metrics = _metrics(config)
    running = False
    try:
        if engine == "spark":
            from ingest.assembly import open_pipeline
            from ingest.engines.spark import SparkEngine  # ConfigError naming the extra when pyspark is missing

            pipeline = open_pipeline(config)
            with contextlib.closing(SparkEngine.create(pipeline.config, pipeline.target, spark)) as on_spark:
                running = True
                events = _lineage(pipeline, metrics) if lineage else None
                with _advising(pipeline):
                    yield Run(pipeline, on_spark, metrics, _progress(config), events)
            return
        # workers start early to overlap this process's imports of pyiceberg and the catalog; once
        # they are imported (the second table of a run of several), a batch starts them as it needs
        pool = workers_for_backlog(config) if early_workers else None
        try:
            from ingest.assembly import open_pipeline  # pyiceberg: ~0.25 s of imports, after the workers' start

            pipeline = open_pipeline(config)
        except BaseException:
            if pool is not None:
                pool.close(kill=True)
            raise
        with contextlib.closing(LocalEngine(config, pipeline.target, pool)) as local:
            running = True
            events = _lineage(pipeline, metrics) if lineage else None
            with _advising(pipeline):
                yield Run(pipeline, local, metrics, _progress(config), events)
    except Exception:
        if metrics is not None and not running:  # the run failed before its first batch: say so too
            metrics.ended(False, None, None)
        raise


@contextlib.contextmanager
def engine_for(pipeline: Opened, engine: EngineChoice = "local") -> Iterator[Run]:
    """A run of an already open ``pipeline`` (a test's, a notebook's) on a new engine, closed after."""
    if engine == "spark":
        from ingest.engines.spark import SparkEngine

        with contextlib.closing(SparkEngine.create(pipeline.config, pipeline.target)) as on_spark, _advising(pipeline):
            yield Run(pipeline, on_spark, progress=_progress(pipeline.config))
        return
    with contextlib.closing(LocalEngine(pipeline.config, pipeline.target)) as local, _advising(pipeline):
        yield Run(pipeline, local, progress=_progress(pipeline.config))


@contextlib.contextmanager
def _advising(pipeline: Opened) -> Iterator[None]:
    """The run of ``pipeline``; as it ends, the consumer group's advisory offsets still unsent are
    sent (a few seconds at most: see :mod:`ingest.kafka.advisory`)."""
    try:
        yield
    finally:
        pipeline.source.flush_advisory()
