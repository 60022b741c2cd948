"""Splitting planned ranges into tasks, and naming why a Spark job failed: no Spark job runs here."""

from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="needs the Spark extra: pip install 'lakehouse-ingest[spark]'")

from ingest.core.ledger import TopicPartition
from ingest.core.plan import Batch
from ingest.core.ranges import Range, split_ranges
from ingest.engines.spark import _translate
from ingest.errors import (
    BrokerUnavailable,
    CatalogUnavailable,
    ConfigError,
    DataLoss,
    ExitCode,
    FatalError,
    RecordTooLarge,
    SparkUnavailable,
)

pytestmark = pytest.mark.spark

ranges_strategy = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 10_000), st.integers(0, 3_000)), max_size=6, unique_by=lambda r: r[0]
).map(lambda items: [(TopicPartition("t", p), start, start + size) for p, start, size in items])


@given(ranges_strategy, st.none() | st.integers(1, 64), st.none() | st.integers(1, 1_000))
def test_tasks_cover_every_planned_offset_exactly_once(
    ranges: list[Range], min_partitions: int | None, max_records: int | None
) -> None:
    tasks = split_ranges(ranges, min_partitions, max_records)

    assert [t.index for t in tasks] == list(range(len(tasks)))
    assert all(t.size > 0 for t in tasks)
    for tp, start, end in ranges:
        mine = [(t.start, t.end) for t in tasks if t.tp == tp]
        if end == start:
            assert mine == []
            continue
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))  # contiguous, no overlap
    if max_records is not None:
        assert all(t.size <= max_records for t in tasks)


def test_a_range_is_split_like_sparks_min_partitions() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)

    tasks = split_ranges([(a, 0, 900), (b, 100, 200)], min_partitions=10)

    # in proportion to size: 900 of 1,000 offsets get 9 tasks, 100 get 1
    assert [(t.tp, t.start, t.end) for t in tasks] == [(a, 100 * i, 100 * (i + 1)) for i in range(9)] + [(b, 100, 200)]
    assert len(split_ranges([(a, 0, 900), (b, 100, 200)], min_partitions=2)) == 2  # enough already
    assert [t.size for t in split_ranges([(a, 0, 10)], max_records_per_partition=4)] == [3, 3, 4]


@dataclass
class _JavaException:
    message: str

    def getMessage(self) -> str:  # the Java method's name
        return self.message


@dataclass
class _JobFailed(Exception):
    java_exception: _JavaException


BATCH = Batch(number=7, base=None, start={}, end={}, cluster_id=None)


def _failed(last_error: str) -> _JobFailed:
    return _JobFailed(
        _JavaException(
            "Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times, most recent failure: Lost task "
            "0.3 in stage 3.0 (TID 12) (127.0.0.1 executor driver): org.apache.spark.api.python.PythonException: "
            'Traceback (most recent call last):\n  File "ingest/kafka/reading.py", line 130, in _drain\n'
            + last_error
            + "\n"
        )
    )


def test_a_domain_error_in_a_task_keeps_its_kind() -> None:
    broker = _translate(_failed("ingest.errors.BrokerUnavailable: no progress from Kafka for 30s"), BATCH)  # type: ignore[arg-type]
    disk = _translate(_failed("ingest.errors.CatalogUnavailable: writing data files failed"), BATCH)  # type: ignore[arg-type]
    fields = _translate(_failed("ingest.errors.DataLoss: data loss on t[0]"), BATCH)  # type: ignore[arg-type]

    assert isinstance(broker, BrokerUnavailable) and broker.retryable
    assert "batch 7" in str(broker) and "no progress from Kafka" in str(broker)
    assert isinstance(disk, CatalogUnavailable)
    assert isinstance(fields, FatalError) and not isinstance(fields, DataLoss) and not fields.retryable


def test_a_config_error_with_fields_in_a_task_keeps_exit_78_across_processes_and_spark() -> None:
    error = RecordTooLarge("t", 0, 3, 3_000_231, 2_000_000)
    copied = pickle.loads(pickle.dumps(error))  # as a worker process sends it
    translated = _translate(_failed(f"ingest.errors.RecordTooLarge: {error}"), BATCH)  # type: ignore[arg-type]

    assert (copied.topic, copied.partition, copied.offset, copied.size, str(copied)) == (
        "t",
        0,
        3,
        3_000_231,
        str(error),
    )
    assert isinstance(translated, ConfigError) and translated.exit_code == ExitCode.CONFIG
    assert "the record batch at offset 3 of t[0]" in str(translated)


def test_a_bug_in_a_task_stays_a_bug_and_a_lost_executor_is_retryable() -> None:
    assert _translate(_failed("RuntimeError: something unexpected"), BATCH) is None  # type: ignore[arg-type]
    lost = _translate(
        _JobFailed(_JavaException("Job aborted due to stage failure: ExecutorLostFailure (executor 3 exited)")),  # type: ignore[arg-type]
        BATCH,
    )
    assert isinstance(lost, SparkUnavailable) and lost.retryable and "run again" in str(lost)
