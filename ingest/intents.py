"""What a commit to a table does, as data: the one argument of :meth:`ingest.ports.LedgerTable.commit`.

Every change this project makes to a table is one of these, committed by compare-and-swap on what
the handle read (the branch head for a snapshot, a ref's old target for a ref move, every ref for
an expiry), never retried or rebased by the library underneath: whoever commits says *what* the
commit does, and the table adapter alone says *how* (pyiceberg's updates and requirements for an
Iceberg table, see :mod:`ingest.iceberg.commits`).

A new kind of commit is a new intent here and its builder in each table adapter; the commit loop,
which observes, decides and settles an unknown outcome, stays the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from ingest.core.ledger import TopicPartition


class DataFile(Protocol):
    """A data file written into a table's location and committed nowhere yet (pyiceberg's
    ``DataFile`` satisfies it, and so does :class:`ingest.testing.memory_state.MemoryFile`)."""

    @property
    def file_path(self) -> str: ...

    @property
    def record_count(self) -> int: ...


#: ``[start, end)`` offset ranges per partition
Spans = Mapping[TopicPartition, Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class Append:
    """A snapshot on the branch that adds ``files`` (none: a snapshot that only carries ``summary``),
    with snapshot ``summary`` and table ``properties`` set in the same commit."""

    files: Sequence[DataFile]
    summary: Mapping[str, str]
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reapply:
    """A snapshot on the branch that adds again the data files snapshot ``snapshot_id`` of the same
    table added on another branch (a publish carrying another writer's append over), with ``summary``."""

    snapshot_id: int
    summary: Mapping[str, str]


@dataclass(frozen=True)
class Rewrite:
    """A snapshot on the branch that replaces data files ``remove`` by ``add`` (a compaction): the
    same rows, other files; and removes delete files ``deletes``, which applied to ``remove`` alone
    (``add`` holds the rows they left)."""

    remove: Sequence[DataFile]
    add: Sequence[DataFile]
    summary: Mapping[str, str]
    deletes: Sequence[DataFile] = ()


@dataclass(frozen=True)
class RewindDeadLetters:
    """A snapshot on the dead-letter table's branch without the dead letters of ``topics`` at or past
    ``to`` (every one of a partition ``to`` does not name) or in ``gaps``, with ``summary``: a
    rollback's rewind; and table ``properties`` set in the same commit."""

    topics: Sequence[str]
    to: Mapping[TopicPartition, int]
    summary: Mapping[str, str]
    gaps: Spans = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RemoveDeadLetters:
    """A snapshot on the dead-letter table's branch without the dead letters in ``spans``, with
    ``summary``: what ``ingest redrive`` committed to the rows."""

    spans: Spans
    summary: Mapping[str, str]


@dataclass(frozen=True)
class RowDelta:
    """A snapshot on the branch that deletes the live rows whose ``key`` columns equal a row of
    ``deleted`` (one column per key column, each key once) and adds ``files``, with ``summary`` (and
    table ``properties`` set in the same commit): a
    changelog batch (an upsert deletes its key's row and adds the new one; a delete only deletes).
    Which rows those are is decided on the head the commit requires, so a compaction or another
    batch in between makes it conflict and decide again, never delete a row it did not see."""

    files: Sequence[DataFile]
    key: Sequence[str]
    deleted: pa.Table
    summary: Mapping[str, str]
    properties: Mapping[str, str] = field(default_factory=dict)


#: the intents whose commit makes a snapshot (:meth:`~ingest.ports.LedgerTable.commit` returns its id)
SnapshotIntent = Append | Reapply | Rewrite | RewindDeadLetters | RemoveDeadLetters | RowDelta


@dataclass(frozen=True)
class MoveRef:
    """Point branch (or ``tag``) ``name`` at ``snapshot_id``, requiring it to point at ``expected``
    (None: that it does not exist yet); with ``drop``, remove that branch in the same swap, requiring
    it to point at ``snapshot_id`` (a publish: main takes the branch's place, and no commit can land
    on the branch once main has left it)."""

    name: str
    snapshot_id: int
    expected: int | None
    tag: bool = False
    drop: str | None = None


@dataclass(frozen=True)
class RemoveRef:
    """Remove branch or tag ``name``, requiring it to point at ``expected``."""

    name: str
    expected: int


@dataclass(frozen=True)
class Expire:
    """Remove ``snapshot_ids``, requiring every branch and tag to be where the handle saw it and no
    ``replay-<id>`` branch (what ``ingest replay`` creates) to exist on one of them."""

    snapshot_ids: Sequence[int]


#: the intents whose commit changes refs or drops snapshots and makes none
RefIntent = MoveRef | RemoveRef | Expire
