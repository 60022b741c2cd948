"""What a memory catalog holds (:mod:`ingest.testing.memory_table`): its data files and
snapshots, the rows a commit removes from them, the faults a commit meets, and the clock its
handles read."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.ledger import TopicPartition
from ingest.intents import (
    Append,
    DataFile,
    Reapply,
    RemoveDeadLetters,
    RewindDeadLetters,
    Rewrite,
    RowDelta,
    SnapshotIntent,
    Spans,
)
from ingest.records import DEAD_LETTERS, Coordinates

#: a table's schema: its columns' names, in the order of their field ids
Columns = tuple[str, ...]


@dataclass(frozen=True)
class MemoryFile:
    """A data file held in memory: invisible until a commit references it."""

    file_path: str
    record_count: int
    data: pa.Table
    #: the schema the file was written with (its columns' field ids are their positions here)
    schema: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemorySnapshot:
    snapshot_id: int
    parent_id: int | None
    summary: Mapping[str, str]
    timestamp_ms: int
    #: every file the snapshot references (its parent's and the ones it added)
    files: tuple[MemoryFile, ...]
    operation: str = "append"
    #: the table's schema when the snapshot was committed
    schema: Columns = ()


@dataclass
class TableState:
    snapshots: dict[int, MemorySnapshot] = field(default_factory=dict)
    refs: dict[str, int] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)
    schema: Columns = ()

    def copy(self) -> TableState:
        return TableState(dict(self.snapshots), dict(self.refs), dict(self.properties), self.schema)


def evolved_columns(schema: Columns, columns: Sequence[str]) -> Columns:
    """``schema`` with the ``columns`` it lacks appended (each taking the next field id)."""
    return schema + tuple(c for c in dict.fromkeys(columns) if c not in schema)


def memory_file(data_file: DataFile) -> MemoryFile:
    if not isinstance(data_file, MemoryFile):
        raise TypeError(f"{data_file!r} was not written by a memory table; it cannot be committed to one")
    return data_file


def past(data: pa.Table, topics: Sequence[str], to: Mapping[TopicPartition, int]) -> pa.Array:
    """Dead letters of ``topics`` at or past ``to`` (every one of a partition ``to`` does not name)."""
    d = DEAD_LETTERS
    doomed = pa.array([False] * data.num_rows, pa.bool_())
    for topic in topics:
        mine = pc.equal(data[d.topic], topic)
        named = [tp.partition for tp in to if tp.topic == topic]
        rest = pc.invert(pc.is_in(data[d.partition], pa.array(named, data[d.partition].type)))
        for tp, end in to.items():
            if tp.topic == topic:
                rest = pc.or_(
                    rest, pc.and_(pc.equal(data[d.partition], tp.partition), pc.greater_equal(data[d.offset], end))
                )
        doomed = pc.or_(doomed, pc.and_(mine, rest))
    return doomed


def in_spans(data: pa.Table, c: Coordinates, spans: Spans) -> pa.Array:
    keep = pa.array([False] * data.num_rows, pa.bool_())
    for tp, ranges in spans.items():
        mine = pc.and_(pc.equal(data[c.topic], tp.topic), pc.equal(data[c.partition], tp.partition))
        for start, end in ranges:
            inside = pc.and_(pc.greater_equal(data[c.offset], start), pc.less(data[c.offset], end))
            keep = pc.or_(keep, pc.and_(mine, inside))
    return keep


def without(
    files: tuple[MemoryFile, ...], doomed: Callable[[pa.Table], pa.Array]
) -> tuple[tuple[MemoryFile, ...], str]:
    """``files`` without the rows ``doomed`` picks (a file that keeps some is rewritten), and the
    snapshot's operation, as Iceberg names it: ``overwrite`` if a file was rewritten, else ``delete``."""
    kept = []
    rewritten = False
    for f in files:
        data = f.data.filter(pc.invert(doomed(f.data)))
        if data.num_rows == f.record_count:
            kept.append(f)
        elif data.num_rows:
            kept.append(replace(f, record_count=data.num_rows, data=data))
            rewritten = True
    return tuple(kept), "overwrite" if rewritten else "delete"


def keyed(data: pa.Table, key: Sequence[str], deleted: pa.Table) -> pa.Array:
    """Which rows of ``data`` have a ``key`` that is a row of ``deleted``."""
    if not deleted.num_rows:
        return pa.repeat(pa.scalar(False), data.num_rows)
    at = data.select(list(key)).append_column("__at", pa.array(range(data.num_rows), pa.int64()))
    found = at.join(deleted.select(list(key)), list(key), join_type="inner")["__at"]
    return pc.is_in(pa.array(range(data.num_rows), pa.int64()), found.combine_chunks())


def files_after(
    live: tuple[MemoryFile, ...], intent: SnapshotIntent, added_by: Callable[[int], tuple[MemoryFile, ...]]
) -> tuple[tuple[MemoryFile, ...], str, Mapping[str, str]]:
    """The files of the snapshot ``intent`` commits on a head of ``live`` files (``added_by``: the
    files a snapshot added), its operation as Iceberg names it, and the table properties it sets."""
    properties: Mapping[str, str] = {}
    operation = "append"
    match intent:
        case Append(files, _, properties):
            after = live + tuple(memory_file(f) for f in files)
        case Reapply(snapshot_id, _):
            after = live + added_by(snapshot_id)
        case Rewrite(remove, add, _):
            gone = {f.file_path for f in remove}
            after = tuple(f for f in live if f.file_path not in gone) + tuple(memory_file(f) for f in add)
            operation = "replace"
        case RewindDeadLetters(topics, to, _, gaps, properties):
            after, operation = without(
                live, lambda data: pc.or_(past(data, topics, to), in_spans(data, DEAD_LETTERS, gaps))
            )
        case RemoveDeadLetters(spans, _):
            after, operation = without(live, lambda data: in_spans(data, DEAD_LETTERS, spans))
        case RowDelta(files, key, deleted, _, properties):
            kept, operation = without(live, lambda data: keyed(data, key, deleted)) if live else ((), "append")
            after = kept + tuple(memory_file(f) for f in files)
    return after, operation, properties


#: what befalls one commit attempt:
#: ``ok`` applied and acknowledged; ``ack-lost`` applied, but the writer sees an error that leaves
#: the outcome open (a timeout, a 5xx); ``unknown`` not applied, with the same error;
#: ``crash-before`` / ``crash-after`` the writer's process dies (:class:`Crashed`) before the
#: commit reaches the catalog / after it was applied
Fault = Literal["ok", "ack-lost", "unknown", "crash-before", "crash-after"]


class Crashed(BaseException):
    """The writer's process died here (think SIGKILL): nothing after this point runs. A
    ``BaseException``, so no ``except Exception`` in the code under test survives it."""


def ticking(step_s: float = 0.25) -> Callable[[], float]:
    """A clock for :attr:`MemoryCatalog.monotonic` that moves ``step_s`` at each reading: what a
    handle loaded stays fresh for a number of readings whatever the speed of the machine, so a test
    that must replay exactly (a Hypothesis state machine) takes the same paths every time."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s
