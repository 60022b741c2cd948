"""The Spark engine: the only module that imports pyspark.

The driver plans and commits exactly as with the local engine (:class:`ingest.pipeline.Pipeline`:
same planner, same ledger, same commit path). Only :meth:`SparkEngine.produce` differs: the
batch's ranges are split into tasks, and each task, on an executor, reads its exact sub-range
``[start, end)`` with the Kafka adapter, decodes it with the same :class:`~ingest.formats.json.Decoder`,
writes Parquet data files into the table location and returns their ``DataFile`` metadata, its
dead letters (Arrow IPC bytes), counts and newest timestamps. The driver commits once.

Why task retries and speculative attempts cannot duplicate data: a task's files are invisible
until the driver commits them, and the driver commits only the ``DataFile`` list it received.
Spark's ``collect()`` delivers exactly one result per task, the first successful attempt's; a
failed attempt returns nothing, and the result of a second (speculative) attempt that also
succeeds is dropped by the scheduler. Every ``write`` names its files with a fresh UUID, so two
attempts never overwrite each other. Files of attempts that did not deliver are referenced by no
snapshot: orphans, exactly like the files of a fenced batch. The driver also checks that the
results cover every planned sub-range exactly once before it commits anything.

Tuning keys, read from the session's conf at every batch (``spark-submit --conf``,
``spark-defaults.conf``, or ``spark.conf.set`` in a notebook):

* ``spark.ingest.minPartitions`` (default: ``spark.default.parallelism``): the least number of
  tasks a batch is split into; large ranges are split proportionally to their size, like the
  ``minPartitions`` option of Spark's Kafka source.
* ``spark.ingest.maxRecordsPerPartition`` (default: unbounded): the most offsets one task reads.

A changelog batch (``changes:``) is one task per Kafka partition, whatever these say: a task folds
its partition's changes in offset order (:mod:`ingest.changes`), and a key's changes are in one
partition. A key changed in two partitions of one batch stops the batch
(:class:`~ingest.errors.KeyInTwoTasks`); the local engine folds such a batch in one task.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from types import TracebackType

from ingest import errors, failpoints
from ingest.config import PipelineConfig
from ingest.core.plan import Batch
from ingest.core.ranges import TaskRange, split_ranges
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import TaskOutput, combine, run_task
from ingest.errors import ConfigError, FatalError, IngestError, RetryableError, SparkUnavailable
from ingest.iceberg.table import IcebergTable
from ingest.ports import Produced
from ingest.progress import Advanced
from ingest.records import Declared
from ingest.route_by.writing import RoutedTables

try:
    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark import StatusTracker, TaskContext
    from pyspark.sql import SparkSession as SparkSession  # re-exported: ingest.runner takes one
except ImportError:
    raise ConfigError("the Spark engine needs pyspark 3.5: pip install 'lakehouse-ingest[spark]'") from None

log = logging.getLogger(__name__)

MIN_PARTITIONS = "spark.ingest.minPartitions"
MAX_RECORDS_PER_PARTITION = "spark.ingest.maxRecordsPerPartition"
#: tests only: ``raise`` or ``kill`` makes the first attempt of every task fail after it wrote its files
TASK_FAILURE_ENV = "INGEST_SPARK_TASK_FAILURE"
_POLL_S = 0.02
_INGEST_ERROR = re.compile(r"^ingest\.errors\.(?P<name>\w+): (?P<message>.*)$", re.MULTILINE)


@dataclass(frozen=True)
class _Job:
    """What every task needs, shipped to the executors (it pickles)."""

    spec: TaskSpec
    #: write-only copy of the rows table: the driver's current metadata, no catalog (see ``detached``)
    rows: IcebergTable | RoutedTables


def _inject_failure() -> None:
    how = os.environ.get(TASK_FAILURE_ENV)
    context = TaskContext.get()
    if not how or context is None or context.attemptNumber() > 0:
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"{TASK_FAILURE_ENV}={how}: injected failure of task {context.partitionId()}, attempt 0")


def _produce_task(job: _Job, task: TaskRange) -> TaskOutput:
    """Runs on an executor: read exactly ``task``'s range, decode, write data files."""
    output = run_task(job.spec, job.rows, task.index, [(task.tp, task.start, task.end)])
    _inject_failure()
    return output


def _produce_partition(job: _Job, tasks: Iterable[TaskRange]) -> Iterator[TaskOutput]:
    for task in tasks:
        yield _produce_task(job, task)


def _translate(error: Py4JJavaError, batch: Batch) -> IngestError | None:
    """The domain error behind a failed Spark job, so the CLI exits with the right code; None if the
    task code raised something that is not a domain error (a bug: the original error stands)."""
    try:
        message = str(error.java_exception.getMessage() or error)
    except Py4JError:  # the JVM is gone: the Python-side text has the same message
        message = str(error)
    found = _INGEST_ERROR.findall(message)
    if found:  # a task raised an IngestError (e.g. Kafka unreachable) spark.task.maxFailures times
        name, text = found[-1]
        kind = getattr(errors, name, None)
        text = f"a Spark task of batch {batch.number} failed: {text}"
        if isinstance(kind, type) and issubclass(kind, IngestError):
            try:
                domain: IngestError = kind(text)
                return domain
            except TypeError:  # an error class with structured fields: keep its kind (and exit code)
                if kind.retryable:
                    return RetryableError(text)
                return ConfigError(text) if issubclass(kind, ConfigError) else FatalError(text)
    if "Traceback (most recent call last)" in message:
        return None
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return SparkUnavailable(f"the Spark job of batch {batch.number} failed: {first}. Nothing was committed; run again.")


class SparkEngine:
    """Turns a batch's ranges into data files with Spark tasks; see the module docstring."""

    def __init__(
        self, config: PipelineConfig, rows: IcebergTable | RoutedTables, spark: SparkSession | None = None
    ) -> None:
        """``spark=None``: start a session from the usual Spark settings when the first batch needs one
        (a run that finds nothing new never starts the JVM), and stop it in :meth:`close`."""
        self.config = config
        self.rows = rows
        self._spark = spark
        self._owns = False

    @classmethod
    def create(
        cls, config: PipelineConfig, rows: IcebergTable | RoutedTables, spark: SparkSession | None = None
    ) -> SparkEngine:
        """The engine writing into ``rows``' location: on ``spark``, else on the active session (a
        notebook's or a job's, not ours to stop), else on one it builds from the usual Spark settings
        (spark-submit arguments, ``spark-defaults.conf``) when a batch first needs it, stopped by
        :meth:`close`."""
        return cls(config, rows, spark or SparkSession.getActiveSession())

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark, self._owns = _start_session(), True
        return self._spark

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        tasks = self.tasks(batch)
        failpoints.reach("before-read")
        outputs = self._run(tasks, batch, fields, advanced) if tasks else []
        failpoints.reach("files-written")
        return combine(batch.ranges(), outputs, lambda problem: SparkUnavailable(f"the Spark job {problem}"))

    def tasks(self, batch: Batch) -> list[TaskRange]:
        """The batch's ranges as tasks, split by the ``spark.ingest.*`` settings current in the session."""
        if not batch.ranges():  # the ledger moves without data (new partitions, a skipped loss): no job
            return []
        if self.config.changes is not None:  # a changelog's partition is folded whole, by one task
            return split_ranges(batch.ranges())
        min_partitions = _positive(self.spark, MIN_PARTITIONS) or self.spark.sparkContext.defaultParallelism
        return split_ranges(batch.ranges(), min_partitions, _positive(self.spark, MAX_RECORDS_PER_PARTITION))

    def _run(
        self, tasks: list[TaskRange], batch: Batch, fields: Sequence[Declared], advanced: Advanced | None
    ) -> list[TaskOutput]:
        """One Spark job, one task per :class:`TaskRange`; the driver thread watches its progress."""
        sc = self.spark.sparkContext
        job = _Job(TaskSpec.of(self.config, fields), self.rows.detached())
        group = f"ingest-{self.config.pipeline}-{batch.number}-{uuid.uuid4().hex[:8]}"

        def collect() -> list[TaskOutput]:
            sc.setJobGroup(group, f"ingest {self.config.pipeline} batch {batch.number}: {len(tasks)} tasks", True)
            rdd = sc.parallelize(tasks, len(tasks))
            outputs: list[TaskOutput] = rdd.mapPartitions(partial(_produce_partition, job)).collect()
            return outputs

        started = time.monotonic()
        with ThreadPoolExecutor(1, thread_name_prefix="ingest-spark") as pool:
            future = pool.submit(collect)
            try:
                self._watch(future, group, tasks, advanced)
                outputs = future.result()
            except Py4JJavaError as error:
                domain = _translate(error, batch)
                if domain is None:
                    raise
                raise domain from None
            except Py4JError as error:  # the JVM is gone (killed, or the session was stopped)
                raise SparkUnavailable(
                    f"lost the Spark JVM during batch {batch.number}: {error}. Nothing was committed; run again."
                ) from None
            except BaseException:
                sc.cancelJobGroup(group)
                raise
        log.info("batch %d: %d Spark tasks done in %.2fs", batch.number, len(tasks), time.monotonic() - started)
        return outputs

    def _watch(
        self, future: Future[list[TaskOutput]], group: str, tasks: list[TaskRange], advanced: Advanced | None
    ) -> None:
        """Wait for the job, reaching the crash-test points ``mid-read`` (tasks are reading) and
        ``mid-write`` (some tasks have written their files) on the driver as the job gets there;
        ``advanced`` hears of the records of the tasks done (a task says nothing before it ends,
        so each done task counts as its share of the batch's records)."""
        tracker = self.spark.sparkContext.statusTracker()
        reached = {"mid-read": False, "mid-write": False}
        total = len(tasks)
        records = sum(task.end - task.start for task in tasks)
        done = 0
        while not future.done():
            try:
                active, completed = _progress(tracker, group)
            except Py4JError:  # the JVM went away; the job's own error says why
                break
            if completed > done:
                if advanced is not None:
                    share = records * completed // total - records * done // total
                    advanced(share, 0, 0)
                done = completed
                log.info("%s: %d of %d tasks done", group, completed, total)
            for point, now in (("mid-read", active > 0 or completed > 0), ("mid-write", completed > 0)):
                if now and not reached[point]:
                    reached[point] = True
                    failpoints.reach(point)
            time.sleep(_POLL_S)
        if future.exception() is not None:  # (waits for the job to end)
            return
        for point in ("mid-read", "mid-write"):  # a job faster than the poll still passes each point, in order
            if not reached[point]:
                failpoints.reach(point)

    def writing_to(self, rows: IcebergTable | RoutedTables) -> SparkEngine:
        """This engine writing with ``rows`` (see :meth:`ingest.ports.Engine.writing_to`)."""
        engine = copy.copy(self)
        engine.rows = rows
        return engine

    def close(self) -> None:
        if self._owns and self._spark is not None:
            self._spark.stop()
            self._spark, self._owns = None, False

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _progress(tracker: StatusTracker, group: str) -> tuple[int, int]:
    """Running and completed tasks of the job group."""
    active = completed = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info else []:
            stage = tracker.getStageInfo(stage_id)
            if stage:
                active, completed = active + stage.numActiveTasks, completed + stage.numCompletedTasks
    return active, completed


def _positive(spark: SparkSession, key: str) -> int | None:
    text = spark.conf.get(key, None)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"Spark setting {key}={text!r}: expected a positive integer")
    return value


@contextlib.contextmanager
def shared_session() -> Iterator[SparkSession]:
    """One session for the engines of several tables (``tables:``) run one after another: the
    active session, or one built from the usual Spark settings and stopped when the block ends
    (an engine stops only a session it built itself)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = _start_session()
    try:
        yield spark
    finally:
        spark.stop()


def _start_session() -> SparkSession:
    started = time.monotonic()
    try:
        spark = SparkSession.builder.getOrCreate()
    except (Py4JError, RuntimeError, OSError) as error:
        raise SparkUnavailable(
            f"cannot start a Spark session: {error}. Check JAVA_HOME and the Spark settings (spark-submit "
            "arguments, SPARK_CONF_DIR/spark-defaults.conf)."
        ) from None
    sc = spark.sparkContext
    if (sc.master or "").startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # local executors are this machine's processes: run them on this interpreter, which has the package
        sc.pythonExec = sys.executable
    log.info(
        "Spark session started in %.2fs (master %s, %d cores)",
        time.monotonic() - started,
        sc.master,
        sc.defaultParallelism,
    )
    return spark
