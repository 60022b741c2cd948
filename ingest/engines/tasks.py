"""Turning planned ranges into data files: the work of every engine, in whatever process it runs.

A *task* reads exact offset ranges ``[start, end)`` from Kafka, decodes them as its
:class:`~ingest.engines.task_spec.TaskSpec` says, writes Parquet data files into the table location,
and returns what it made (:class:`TaskOutput`): file metadata, dead letters, counts. Nothing a task
writes is visible until the pipeline commits the files it got back, so a task that fails, is killed,
or runs twice leaves only unreferenced files (orphans), never duplicates. The local engine runs tasks
in worker processes (or in-process for small batches), the Spark engine on executors; both combine
the outputs with :func:`combine`, which refuses results that do not cover every task exactly once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from ingest import arrow_memory, nogc
from ingest.changes import OP, KeyDeletes, fold
from ingest.core.ledger import TopicPartition, merge_timestamps
from ingest.core.ranges import Range, coverage_problem, share
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.engines.task_spec import TaskSpec
from ingest.errors import IngestError, KeyInTwoTasks
from ingest.intents import DataFile
from ingest.kafka.reading import Stops
from ingest.kafka.source import KafkaSource
from ingest.ports import FileWriter, Produced, ValueDecoder
from ingest.progress import Advanced
from ingest.records import DEAD_LETTERS, ROWS, Coordinates, RawChunk
from ingest.route_by.writing import RoutedTables

if TYPE_CHECKING:  # a task writes through the table it is given: importing pyiceberg is the caller's
    from ingest.iceberg.table import IcebergTable


# --- handing off ------------------------------------------------------------------------------


def hand_off(stops: Stops, parts: int, least: int = 1) -> list[list[Range]]:
    """Up to ``parts`` shares, for other readers, of what the reader behind ``stops`` has not read.

    The unread rest is cut as :func:`share` cuts a batch, into ``parts + 1`` near-equal stretches;
    the reader keeps the first (its ranges' ends move back to where that stretch ends) and the
    others are returned. A share smaller than ``least`` offsets is not worth another reader, so
    fewer shares are given then, or none.
    """
    with stops.lock:
        unread = stops.unread()
        parts = min(parts, sum(end - start for _, start, end in unread) // max(1, least) - 1)
        if parts < 1:
            return []
        groups = share(unread, parts + 1)
        kept = {tp: end for tp, _, end in groups[0]}
        for tp, position, _ in unread:
            stops.end[tp] = kept.get(tp, position)
        return groups[1:]


# --- running ------------------------------------------------------------------------------------

T = TypeVar("T")
_DONE = object()


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Iterate ``items`` in a background thread, ``depth`` items ahead of the consumer.

    Reading Kafka (a Python loop over librdkafka messages) then overlaps with decoding and
    Parquet writing, which run in Arrow without the GIL. Memory stays bounded: at most
    ``depth + 2`` chunks exist at once. An exception in the reader is raised in the consumer.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as error:  # handed to the consumer, which re-raises it
            offer(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # e.g. closes the Kafka consumer when the batch stops early

    thread = threading.Thread(target=pump, name="kafka-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=30)


def _max_timestamps(table: pa.Table, columns: Coordinates) -> dict[TopicPartition, int]:
    if table.num_rows == 0:
        return {}
    topic, partition, ts = columns.topic, columns.partition, columns.timestamp
    grouped = table.group_by([topic, partition]).aggregate([(ts, "max")])
    result = {}
    for row in grouped.to_pylist():
        value = row[f"{ts}_max"]
        if value is not None:
            result[TopicPartition(row[topic], row[partition])] = int(value.timestamp() * 1000)
    return result


def decode_and_write(
    chunks: Iterable[RawChunk],
    decoder: ValueDecoder,
    rows: FileWriter,
    write_rows: int,
    reach: Callable[[str], None] = lambda _: None,
    advanced: Advanced = lambda records, nbytes, files: None,
    key: Sequence[str] | None = None,
) -> Produced:
    """Decode each chunk and write the rows as data files (committed nowhere); every task's core.
    ``advanced`` hears of each chunk decoded and the files written with it.

    With ``key`` (``changes:``), the decoder makes changes (:mod:`ingest.changes`): they are held
    until the last chunk, then folded; the files hold each key's newest row if an upsert, and the
    result names every key changed (:attr:`Produced.deletes`).

    Decoded rows (compact Arrow) are held until ``write_rows`` of them are ready, so files are
    sized by ``write_rows`` while the raw chunks, which cost several times more memory per record
    as Python objects, stay small. ``reach`` is called at the ``mid-read`` failpoint when the first
    chunk arrives and at ``mid-write`` before the first file is written.
    """
    files: list[DataFile] = []
    dead = DeadLetterSpool()
    held: list[pa.Table] = []
    held_rows = records = nbytes = unknown = 0
    timestamps: dict[TopicPartition, int] = {}

    def write() -> None:
        nonlocal held, held_rows
        if not files:
            reach("mid-write")
        files.extend(rows.write(pa.concat_tables(held)))
        held, held_rows = [], 0

    for i, chunk in enumerate(chunks):
        if i == 0:
            reach("mid-read")
        decoded = decoder.decode(chunk)
        records += len(chunk)
        nbytes += chunk.nbytes
        unknown += decoded.unknown
        timestamps = merge_timestamps(
            [
                timestamps,
                _max_timestamps(decoded.rows, ROWS),
                _max_timestamps(decoded.dead_letters, DEAD_LETTERS),
            ]
        )
        held.append(decoded.rows)
        held_rows += decoded.rows.num_rows
        written = len(files)
        if held_rows >= write_rows and key is None:  # (a changelog's changes are folded once all are read)
            write()
        dead.add(decoded.dead_letters)
        advanced(len(chunk), chunk.nbytes, len(files) - written)
    deletes = None
    if key is not None and held:
        held, deletes = _folded(held, key)
    if held_rows:
        written = len(files)
        write()
        advanced(0, 0, len(files) - written)
    return Produced(files, dead, records, nbytes, timestamps, unknown, deletes=deletes)


def _folded(changes: list[pa.Table], key: Sequence[str]) -> tuple[list[pa.Table], KeyDeletes]:
    """A task's changes folded (:func:`ingest.changes.fold`): each key's newest row if an upsert,
    and every key changed."""
    together = pa.concat_tables(changes)
    folded = fold(together, key)
    return [together.take(folded.rows).drop_columns([OP])], KeyDeletes(tuple(key), folded.keys)


#: a task that read this much (8 MB, one read chunk's bytes) hands what it freed back to the system
#: (~10 ms). Kept by the allocators (glibc's for librdkafka and the reader thread, jemalloc's for
#: Arrow), it lay beside the next batch's own peak: a catch-up's second 1M-record batch (55 MB per
#: process) peaked at 985-1,194 MB over two processes, 796-821 MB so. A task of 23-26 MB already
#: leaves a 64-69 MB glibc arena resident (it was 32 MB here: a worker that joined the first batch
#: late carried one into the second, 936-957 MB). Small batches (``--every`` on a quiet topic) keep
#: theirs for the next.
RELEASE_AFTER_BYTES = 8 << 20


def produce_ranges(
    spec: TaskSpec,
    rows: IcebergTable | RoutedTables,
    stops: Stops,
    reach: Callable[[str], None] = lambda _: None,
    advanced: Advanced = lambda records, nbytes, files: None,
) -> Produced:
    """Read exactly the ranges of ``stops``, up to wherever :func:`hand_off` leaves their ends
    (Kafka is read in a background thread while earlier chunks decode and write), decode, and
    write data files into ``rows``' location. The cyclic garbage collector is paused meanwhile
    (:mod:`ingest.nogc`): a Python object per record forms no cycles. Arrow allocates from jemalloc
    (:mod:`ingest.arrow_memory`), and what a large task freed goes back to the system when it ends
    (:data:`RELEASE_AFTER_BYTES`)."""
    arrow_memory.use_jemalloc()
    source = KafkaSource(spec.kafka, spec.topics, spec.group_id, spec.read_timeout_s)
    writer = rows.for_task() if isinstance(rows, RoutedTables) else rows
    with nogc.paused():
        chunks = prefetched(source.read(stops))
        decoder = spec.decoder(writer if isinstance(writer, RoutedTables) else None)
        key = spec.changes[1] if spec.changes is not None else None
        produced = decode_and_write(chunks, decoder, writer, spec.chunk_records, reach, advanced, key)
    if produced.nbytes >= RELEASE_AFTER_BYTES:
        arrow_memory.release()
    if isinstance(writer, RoutedTables):  # rows for tables not created yet: the pipeline creates them
        produced.missing = frozenset(writer.missing)
    return produced


@dataclass(frozen=True)
class TaskOutput:
    """What one successful task returns to the engine that ran it. Nothing in it is committed yet."""

    index: int
    files: list[DataFile]
    #: the task's dead letters, compressed
    dead_letters: DeadLetterSpool
    records: int
    nbytes: int
    timestamps: dict[TopicPartition, int]
    #: the offsets the task read, ``[start, end)`` per partition
    ranges: tuple[Range, ...]
    #: records with fields the table does not declare
    unknown: int = 0
    #: ``route_by``: tables rows were routed to that do not exist yet
    missing: frozenset[str] = frozenset()
    #: ``changes:``: the keys the task's changes changed
    deletes: KeyDeletes | None = None


def run_task(
    spec: TaskSpec,
    rows: IcebergTable | RoutedTables,
    index: int,
    ranges: Sequence[Range] | Stops,
    reach: Callable[[str], None] = lambda _: None,
    advanced: Advanced = lambda records, nbytes, files: None,
) -> TaskOutput:
    """One task: :func:`produce_ranges`, returned in a form that crosses process boundaries."""
    stops = ranges if isinstance(ranges, Stops) else Stops(ranges)
    produced = produce_ranges(spec, rows, stops, reach, advanced)
    return TaskOutput(
        index,
        produced.files,
        produced.dead_letters,
        produced.records,
        produced.nbytes,
        produced.timestamps,
        tuple(stops.ranges()),  # once the read is over, what it covered
        produced.unknown,
        produced.missing,
        produced.deletes,
    )


def combine(
    expected: Sequence[Range], outputs: Sequence[TaskOutput], incomplete: Callable[[str], IngestError]
) -> Produced:
    """The outputs of a batch's tasks as one result; ``incomplete(message)`` is raised unless the
    ranges the tasks read cover each ``expected`` range exactly once (committing then would lose
    or duplicate records)."""
    problem = coverage_problem(expected, [r for output in outputs for r in output.ranges])
    if problem is not None:
        raise incomplete(f"got results that {problem}; nothing was committed. Run again.")
    ordered = sorted(outputs, key=lambda output: output.index)
    return Produced(
        files=[f for output in ordered for f in output.files],
        dead_letters=DeadLetterSpool.joined(output.dead_letters for output in ordered),
        records=sum(output.records for output in ordered),
        nbytes=sum(output.nbytes for output in ordered),
        timestamps=merge_timestamps(output.timestamps for output in ordered),
        unknown=sum(output.unknown for output in ordered),
        missing=frozenset().union(*(output.missing for output in ordered)),
        deletes=_keys_changed([output.deletes for output in ordered if output.deletes is not None]),
    )


def _keys_changed(parts: Sequence[KeyDeletes]) -> KeyDeletes | None:
    """The keys the tasks of a changelog batch changed, each in one task (a task reads whole
    partitions); :class:`~ingest.errors.KeyInTwoTasks` if a key was changed in two (each wrote its
    newest row: the batch would land both, and which is newer neither task knows)."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    key = parts[0].key
    keys = pa.concat_tables([part.keys for part in parts])
    counted = keys.group_by(list(key), use_threads=False).aggregate([([], "count_all")])
    twice = counted.filter(pa.compute.greater(counted["count_all"], 1))
    if twice.num_rows:
        raise KeyInTwoTasks(
            f"key {twice.select(list(key)).slice(0, 1).to_pylist()[0]} of the changelog was changed in two "
            "partitions of this batch, which two tasks read; the order of its changes across partitions is "
            "unknown to each, so nothing was committed. A key's changes belong in one partition (Kafka's "
            "partitioner by key puts them there, until the topic gains partitions). Run this batch with the "
            "local engine (`ingest run`), which folds a changelog batch in one task (a key's change in the "
            "higher partition wins), then carry on."
        )
    return KeyDeletes(key, keys)
