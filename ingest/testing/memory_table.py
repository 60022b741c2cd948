"""An in-memory ledger table, for tests of the commit protocol and of integrations built on it.

:class:`MemoryCatalog` holds the truth (snapshots, branch refs, table properties), as a catalog
does; :class:`MemoryTable` is one writer's handle on it and satisfies
:class:`ingest.ports.LedgerTable` the way :class:`ingest.iceberg.table.IcebergTable` does:

* a handle reads a copy of the catalog's state (:meth:`MemoryTable.refresh`) and commits by
  compare-and-swap on the branch head it holds: a commit on a moved head raises
  :class:`~ingest.errors.CommitConflict` and changes nothing;
* a successful commit leaves the handle holding the state it committed;
* snapshots carry their whole file list (what a manifest list references), so expiry removes a
  snapshot's metadata, never the rows of a later snapshot, and the walk back from a head stops at
  the first expired parent, as Iceberg's does;
* the schema is its column names in field-id order: :meth:`MemoryTable.evolve_to` appends the
  missing ones with the handle's next commit (which then also requires the schema it held, as
  Iceberg's ``AssertCurrentSchemaId``), and files written for an evolved schema are committed only
  under that same schema (else :class:`~ingest.errors.SchemaMoved`); another tool's ``ALTER TABLE``
  is :meth:`MemoryCatalog.alter_schema`.

Faults are injected per commit attempt: :attr:`MemoryCatalog.on_commit` is asked, before each
attempt, what befalls it (:data:`Fault`); it may also do other work first (another writer's
commit, a foreign commit, an expiry), which is how tests slip a concurrent writer in between a
writer's observation and its commit. Foreign writers commit with :meth:`MemoryCatalog.append`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

import pyarrow as pa

from ingest.core.expiry import MAIN
from ingest.core.ledger import SnapshotView, TopicPartition
from ingest.errors import BranchGone, CommitConflict, CommitUnknown, SchemaMoved, WrittenFilesGone
from ingest.intents import DataFile, Expire, MoveRef, RefIntent, RemoveRef, SnapshotIntent
from ingest.ports import Head
from ingest.records import DEAD_LETTERS, ROWS, Coordinates, Declared
from ingest.testing.memory_state import (
    Columns,
    Crashed,
    Fault,
    MemoryFile,
    MemorySnapshot,
    TableState,
    evolved_columns,
    files_after,
    in_spans,
    memory_file,
    without,
)


def _no_fault(table: MemoryTable) -> Fault:
    return "ok"


class MemoryCatalog:
    """The shared state of one table, and the fault schedule of commits to it."""

    def __init__(self, identifier: str = "memory.table") -> None:
        self.identifier = identifier
        self._state = TableState()
        self._ids = itertools.count(1)
        self._files = itertools.count(1)
        #: every data file a handle wrote, by path (what storage holds, committed or not)
        self.stored: dict[str, MemoryFile] = {}
        self._clock = itertools.count(1_700_000_000_000)
        #: asked before every commit attempt through a handle; see :data:`Fault`
        self.on_commit: Callable[[MemoryTable], Fault] = _no_fault
        #: every snapshot ever committed, in commit order, with its branch: expiry removes none of it
        self.log: list[tuple[str, MemorySnapshot]] = []
        #: the clock the handles' ``max_age_s`` is measured on (a test that must replay exactly sets
        #: one that does not depend on how fast it runs)
        self.monotonic: Callable[[], float] = time.monotonic

    def table(self, branch: str = MAIN) -> MemoryTable:
        """A new handle (a writer's view), loaded now."""
        return MemoryTable(self, branch)

    # --- what other writers and maintenance do -----------------------------------------------

    def append(
        self,
        summary: Mapping[str, str],
        files: Sequence[MemoryFile] = (),
        *,
        branch: str = MAIN,
        properties: Mapping[str, str] | None = None,
        operation: str = "append",
    ) -> int:
        """A commit by another writer on the branch's current head (it needs no compare-and-swap:
        it reads and commits at once)."""
        head = self._state.refs.get(branch)
        inherited = self._state.snapshots[head].files if head is not None else ()
        return self._apply(head, branch, summary, inherited + tuple(files), properties or {}, operation)

    def delete(self, summary: Mapping[str, str], doomed: Callable[[pa.Table], pa.Array], branch: str = MAIN) -> int:
        """A commit by another writer that removes the rows ``doomed`` picks (a mask over a file's data)."""
        head = self._state.refs.get(branch)
        files, operation = without(self._state.snapshots[head].files if head is not None else (), doomed)
        return self._apply(head, branch, summary, files, {}, operation)

    def set_ref(self, branch: str, snapshot_id: int) -> None:
        """Another tool (or ``ingest replay``) makes branch ``branch`` at ``snapshot_id``."""
        self._state.refs[branch] = snapshot_id

    def alter_schema(self, *columns: str) -> None:
        """Another tool's ``ALTER TABLE … ADD COLUMN``: a new schema, and no snapshot."""
        self._state.schema = evolved_columns(self._state.schema, columns)

    def expire(self, snapshot_ids: Sequence[int]) -> None:
        """Remove snapshots (their metadata: later snapshots keep referencing their files)."""
        for snapshot_id in snapshot_ids:
            self._state.snapshots.pop(snapshot_id, None)
        self._state.refs = {name: i for name, i in self._state.refs.items() if i in self._state.snapshots}

    # --- what tests look at -------------------------------------------------------------------

    def head(self, branch: str = MAIN) -> int | None:
        return self._state.refs.get(branch)

    @property
    def refs(self) -> Mapping[str, int]:
        return dict(self._state.refs)

    @property
    def properties(self) -> Mapping[str, str]:
        return dict(self._state.properties)

    @property
    def schema(self) -> Columns:
        return self._state.schema

    def snapshots(self) -> list[MemorySnapshot]:
        """Every snapshot not expired, oldest first."""
        return sorted(self._state.snapshots.values(), key=lambda s: s.snapshot_id)

    def live_files(self, branch: str = MAIN) -> tuple[MemoryFile, ...]:
        head = self._state.refs.get(branch)
        return self._state.snapshots[head].files if head is not None else ()

    def scan(self, branch: str = MAIN) -> pa.Table | None:
        """The rows of the branch head (None: no files)."""
        files = self.live_files(branch)
        # files written before a column was added read it as null, as a scan of an Iceberg table does
        return pa.concat_tables([f.data for f in files], promote_options="permissive") if files else None

    # --- the handles' side --------------------------------------------------------------------

    def _load(self) -> TableState:
        return self._state.copy()

    def _new_file(self, data: pa.Table, schema: Columns = ()) -> MemoryFile:
        path = f"memory://{self.identifier}/data/{next(self._files):08d}.parquet"
        self.stored[path] = MemoryFile(path, data.num_rows, data, schema)
        return self.stored[path]

    def _apply(
        self,
        parent: int | None,
        branch: str,
        summary: Mapping[str, str],
        files: tuple[MemoryFile, ...],
        properties: Mapping[str, str],
        operation: str = "append",
        schema: Columns | None = None,
    ) -> int:
        """A snapshot on ``parent`` referencing ``files`` (its whole file list), made ``branch``'s head."""
        if schema is not None:
            self._state.schema = schema
        snapshot_id = next(self._ids)
        snapshot = MemorySnapshot(
            snapshot_id, parent, dict(summary), next(self._clock), files, operation, self._state.schema
        )
        self._state.snapshots[snapshot_id] = snapshot
        self.log.append((branch, snapshot))
        self._state.refs[branch] = snapshot_id
        self._state.properties.update(properties)
        return snapshot_id


class MemoryTable:
    """One writer's handle on a :class:`MemoryCatalog` (a :class:`~ingest.ports.LedgerTable`)."""

    def __init__(self, catalog: MemoryCatalog, branch: str = MAIN) -> None:
        self.catalog = catalog
        self._branch = branch
        self._held = catalog._load()
        self._loaded_at = catalog.monotonic()
        #: the columns rows are written with from now on, while the table's schema lacks some
        self._wanted: Columns | None = None
        #: the evolved schema files were last written with
        self._written_with: Columns | None = None

    @property
    def identifier(self) -> str:
        return self.catalog.identifier

    @property
    def branch(self) -> str:
        return self._branch

    def refresh(self, max_age_s: float = 0.0) -> Head:
        if self.catalog.monotonic() - self._loaded_at >= max_age_s:
            self._held = self.catalog._load()
            self._loaded_at = self.catalog.monotonic()
            if self._branch != MAIN and self._branch not in self._held.refs:  # as an Iceberg table's handle
                raise BranchGone(f"branch {self._branch} of {self.identifier} no longer exists")
        return self.head()

    def head(self) -> Head:
        return Head(self._held.refs.get(self._branch), dict(self._held.properties))

    def branch_head(self, branch: str) -> int | None:
        return self._held.refs.get(branch)

    def detached(self) -> MemoryTable:
        """A copy that writes data files (in memory, no connection or credential to leave out)."""
        return self.on_branch(self._branch)

    def on_branch(self, branch: str) -> MemoryTable:
        handle = MemoryTable(self.catalog, branch)
        handle._held, handle._loaded_at, handle._wanted = self._held, self._loaded_at, self._wanted
        return handle

    def ancestry(self, start: int | None = None) -> Iterator[SnapshotView]:
        snapshot_id = start if start is not None else self._held.refs.get(self._branch)
        while snapshot_id is not None:
            snapshot = self._held.snapshots.get(snapshot_id)
            if snapshot is None:  # expired: the chain is broken here
                return
            yield SnapshotView(snapshot.snapshot_id, snapshot.summary, snapshot.timestamp_ms, snapshot.operation)
            snapshot_id = snapshot.parent_id

    def all_snapshots(self) -> list[SnapshotView]:
        """Every snapshot the handle holds, oldest first."""
        return [view for i in sorted(self._held.snapshots) for view in itertools.islice(self.ancestry(i), 1)]

    def evolve_to(self, fields: Sequence[Declared]) -> None:
        wanted = tuple(f.name for f in fields)
        self._wanted = wanted if evolved_columns(self._held.schema, wanted) != self._held.schema else None

    def _staged(self) -> Columns:
        """The schema this handle's next commit gives the table, from the schema it holds."""
        return evolved_columns(self._held.schema, self._wanted) if self._wanted is not None else self._held.schema

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[DataFile]:
        if self._wanted is not None:
            self._written_with = self._staged()
        return [self.catalog._new_file(data, self._staged())] if data.num_rows else []

    def adopt(self, paths: Sequence[str]) -> list[DataFile]:
        gone = [path for path in paths if path not in self.catalog.stored]
        if gone:
            raise WrittenFilesGone(f"{self.identifier}: data files no longer stored: {', '.join(gone)}")
        return [self.catalog.stored[path] for path in paths]

    def dead_letter_coordinates(self, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]]) -> pa.Table:
        return self.coordinates_in(DEAD_LETTERS, spans, self._held.refs.get(self._branch))

    def coordinates_in(
        self, columns: Coordinates, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]], snapshot_id: int | None
    ) -> pa.Table:
        """The coordinates (named as ``columns`` says) of the records in ``spans`` at ``snapshot_id``."""
        data = self._coordinates(columns, snapshot_id)
        return data.filter(in_spans(data, columns, spans))

    def scan_columns(self, columns: Sequence[str], snapshot_id: int | None = None) -> pa.Table:
        """The coordinate ``columns`` (the rows table's or the dead-letter table's) of every record at
        ``snapshot_id`` (default: the branch head)."""
        c = ROWS if columns[0] == ROWS.topic else DEAD_LETTERS
        at = snapshot_id if snapshot_id is not None else self._held.refs.get(self._branch)
        return self._coordinates(c, at).select(list(columns))

    def _coordinates(self, c: Coordinates, snapshot_id: int | None) -> pa.Table:
        files = self._held.snapshots[snapshot_id].files if snapshot_id is not None else ()
        schema = pa.schema(c.fields()[:3])
        return pa.concat_tables([schema.empty_table(), *(f.data.select(schema.names).cast(schema) for f in files)])

    def read_written(self, paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """``columns`` of data files written and not committed yet."""
        data = [memory_file(f).data.select(list(columns)) for f in self.adopt(paths)]
        return pa.concat_tables(data) if data else pa.table({c: [] for c in columns})

    @overload
    def commit(self, intent: SnapshotIntent) -> int: ...

    @overload
    def commit(self, intent: RefIntent) -> None: ...

    def commit(self, intent: SnapshotIntent | RefIntent) -> int | None:
        """``intent`` by compare-and-swap, as :meth:`ingest.iceberg.table.IcebergTable.commit` does,
        with the fault :attr:`MemoryCatalog.on_commit` picks."""
        fault = self.catalog.on_commit(self)  # may let other writers commit first
        if fault == "crash-before":
            raise Crashed("the writer died before its commit reached the catalog")
        if fault == "unknown":
            raise CommitUnknown("memory catalog: the request timed out before it was applied")
        snapshot_id = None
        if isinstance(intent, MoveRef | RemoveRef | Expire):
            self._move_refs(intent)
        else:
            snapshot_id = self._snapshot(intent)
        self._held = self.catalog._load()
        if self._wanted is not None and evolved_columns(self._held.schema, self._wanted) == self._held.schema:
            self._wanted = self._written_with = None  # the table took the evolution
        self._loaded_at = -math.inf  # like IcebergTable: a commit is not a fresh observation
        if fault == "crash-after":
            raise Crashed("the writer died after its commit was applied, before it heard so")
        if fault == "ack-lost":
            raise CommitUnknown("memory catalog: the commit was applied but its acknowledgement was lost")
        return snapshot_id

    def _snapshot(self, intent: SnapshotIntent) -> int:
        staged = self._staged()
        if self._wanted is not None and self._written_with is not None and staged != self._written_with:
            raise SchemaMoved(
                f"{self.identifier}: the schema changed while this batch's files were written with an evolved one; "
                "nothing was committed"
            )
        held = self._held.refs.get(self._branch)
        current = self.catalog.head(self._branch)
        if current != held:
            raise CommitConflict(
                f"{self.identifier}: branch {self._branch} is at {current}, the commit required {held}"
            )
        if staged != self._held.schema and self.catalog.schema != self._held.schema:
            raise CommitConflict(f"{self.identifier}: the schema changed since this handle loaded it")
        live = self._held.snapshots[held].files if held is not None else ()
        after, operation, properties = files_after(live, intent, self._added_by)
        # a commit that does not evolve the schema leaves the table's current one (which another
        # writer may have evolved since this handle loaded it) as it is, as Iceberg's appends do
        evolved = staged if staged != self._held.schema else None
        return self.catalog._apply(held, self._branch, intent.summary, after, properties, operation, evolved)

    def _added_by(self, snapshot_id: int) -> tuple[MemoryFile, ...]:
        snapshot = self._held.snapshots.get(snapshot_id)
        if snapshot is None:  # expired since it was listed, as IcebergTable has it
            raise CommitConflict(f"{self.identifier}: snapshot {snapshot_id} to re-apply is no longer in the table")
        parent = self._held.snapshots.get(snapshot.parent_id) if snapshot.parent_id is not None else None
        before = {f.file_path for f in parent.files} if parent is not None else set()
        return tuple(f for f in snapshot.files if f.file_path not in before)

    def _move_refs(self, intent: RefIntent) -> None:
        refs = self.catalog._state.refs
        match intent:
            case MoveRef(name, snapshot_id, expected, _, drop):
                if snapshot_id not in self.catalog._state.snapshots:  # pyiceberg's ValueError, as IcebergTable has it
                    raise CommitConflict(f"{self.identifier}: cannot set {name} to unknown snapshot {snapshot_id}")
                for ref, required in ((name, expected), *([(drop, snapshot_id)] if drop is not None else [])):
                    if refs.get(ref) != required:
                        raise CommitConflict(
                            f"{self.identifier}: {ref} is at {refs.get(ref)}, the commit required {required}"
                        )
                refs[name] = snapshot_id
                if drop is not None:
                    del refs[drop]
            case RemoveRef(name, expected):
                if refs.get(name) != expected:
                    raise CommitConflict(
                        f"{self.identifier}: {name} is at {refs.get(name)}, the commit required {expected}"
                    )
                del refs[name]
            case Expire(snapshot_ids):
                if refs != self._held.refs or any(f"replay-{i}" in refs for i in snapshot_ids):
                    raise CommitConflict(f"{self.identifier}: the refs changed since this handle loaded them")
                self.catalog.expire(snapshot_ids)
