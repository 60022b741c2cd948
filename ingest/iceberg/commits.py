"""Each commit intent (:mod:`ingest.intents`) as what pyiceberg commits: a snapshot intent staged
into a transaction on the branch, a ref intent as metadata updates and the requirements they need.

Only the building is here; :meth:`ingest.iceberg.table.IcebergTable.commit` holds the handle's
metadata, stages the schema evolution first, makes the one catalog call, and maps its outcome to
a conflict or an unknown outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import (
    AlwaysFalse,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    Or,
)
from pyiceberg.expressions.parser import parse
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from ingest import records
from ingest.core.ledger import TopicPartition
from ingest.core.ledger_codec import PIPELINE_TABLE_PROPERTIES
from ingest.errors import CommitConflict
from ingest.iceberg.compaction import stage_rewrite
from ingest.iceberg.row_delta import stage_row_delta
from ingest.intents import (
    Append,
    Expire,
    MoveRef,
    Reapply,
    RefIntent,
    RemoveDeadLetters,
    RemoveRef,
    RewindDeadLetters,
    Rewrite,
    RowDelta,
    SnapshotIntent,
    Spans,
)
from ingest.intents import DataFile as WrittenFile


def without_library_retries(table: Table, metadata: TableMetadata | None = None) -> Table:
    """``table`` (over ``metadata``, default its own) as a base for one commit that pyiceberg
    must not retry: pyiceberg reads the retry count from the base metadata's properties when the
    commit is made. The override is never written: the catalog applies only the commit's updates
    to its own current metadata."""
    metadata = metadata if metadata is not None else table.metadata
    exact = metadata.model_copy(update={"properties": {**metadata.properties, **PIPELINE_TABLE_PROPERTIES}})
    return Table(table.name(), exact, table.metadata_location, table.io, table.catalog, table.config)


def head_only(metadata: TableMetadata, branch: str) -> TableMetadata:
    """``metadata`` cut to ``branch``'s head: what an append to that head needs.

    pyiceberg's ``Transaction`` re-derives, and deep-copies, the whole table metadata each time
    it reads it (about fifteen times per append), so an append's cost grew with the number of
    snapshots (~1 s at 1,000). An append reads only the head snapshot (its manifest list and
    summary totals), the schema, spec and properties; the catalog applies the resulting
    updates to its own, complete metadata under the same head requirement, so the committed
    table is the same. The handle returned by the commit holds the catalog's full metadata.
    """
    ref = metadata.refs.get(branch)
    head = ref.snapshot_id if ref is not None else None
    return metadata.model_copy(
        update={
            "snapshots": [s for s in metadata.snapshots if s.snapshot_id == head],
            "refs": {branch: ref} if ref is not None else {},
            "snapshot_log": [],
            "metadata_log": [],
        }
    )


@contextlib.contextmanager
def refused_as_conflict() -> Iterator[None]:
    """A requirement pyiceberg checks against the held metadata while it builds a commit (the
    branch's head, its existence) fails as the catalog's would: a conflict, to be observed again."""
    try:
        yield
    except CommitFailedException as error:
        raise CommitConflict(str(error)) from None


def files_added(intent: SnapshotIntent, table: Table) -> list[DataFile]:
    """The data files ``intent`` adds to the branch (what must have been written under the table's
    current partition spec)."""
    match intent:
        case Append(files):
            return [ours(f) for f in files]
        case Reapply(snapshot_id):
            if table.metadata.snapshot_by_id(snapshot_id) is None:  # expired since it was listed
                raise CommitConflict(f"{table.name()}: snapshot {snapshot_id} to re-apply is no longer in the table")
            return added_data_files(table, snapshot_id)
        case Rewrite(_, add):
            return [ours(f) for f in add]
        case RowDelta(files):
            return [ours(f) for f in files]
    return []


def stage(
    transaction: Transaction, intent: SnapshotIntent, table: Table, branch: str, added: Sequence[DataFile]
) -> int | None:
    """Stage ``intent``'s snapshot on ``branch`` of ``table`` (the handle's) into ``transaction``
    (``added``: its :func:`files_added`); its snapshot id, or None where pyiceberg decides it at
    commit (a delete: the branch head after the commit is the one)."""
    summary = dict(intent.summary)
    if isinstance(intent, Append | RowDelta | RewindDeadLetters) and intent.properties:
        transaction.set_properties(dict(intent.properties))
    where = _doomed(intent)
    if where is not None:
        head = table.metadata.refs.get(branch)
        doomed = 0
        if head is not None:
            offset = records.DEAD_LETTERS.offset
            doomed = table.scan(row_filter=where, snapshot_id=head.snapshot_id, selected_fields=(offset,)).count()
        if doomed:
            transaction.delete(where, snapshot_properties=summary, branch=branch)
            return None
        # nothing to remove: a delete would make no snapshot, and the summary (a ledger) must land
    if isinstance(intent, RowDelta):
        return stage_row_delta(transaction, intent, table, branch, added)
    if isinstance(intent, Rewrite) and intent.deletes:
        remove, deletes = [ours(f) for f in intent.remove], [ours(f) for f in intent.deletes]
        return stage_rewrite(transaction, table, branch, summary, remove, deletes, added)
    if isinstance(intent, Rewrite):
        with transaction.update_snapshot(snapshot_properties=summary, branch=branch).overwrite() as overwrite:
            for removed in intent.remove:
                overwrite.delete_data_file(ours(removed))
            for data_file in added:
                overwrite.append_data_file(data_file)
            return overwrite.snapshot_id
    with transaction.update_snapshot(snapshot_properties=summary, branch=branch).fast_append() as append:
        for data_file in added:
            append.append_data_file(data_file)
        return append.snapshot_id


def _doomed(intent: SnapshotIntent) -> str | BooleanExpression | None:
    """The rows ``intent`` removes, as a row filter; None if it removes none by filter."""
    match intent:
        case RewindDeadLetters(topics, to, _, gaps):
            past = dead_letters_past(topics, to)
            return Or(parse(past), in_spans(gaps)) if gaps else past
        case RemoveDeadLetters(spans):
            return in_spans(spans)
    return None


def added_data_files(table: Table, snapshot_id: int) -> list[DataFile]:
    """The data files snapshot ``snapshot_id`` added (what re-applying it elsewhere needs)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return []
    io = table.io
    return [
        entry.data_file
        for manifest in snapshot.manifests(io=io)
        if manifest.content == ManifestContent.DATA and manifest.added_snapshot_id == snapshot_id
        for entry in manifest.fetch_manifest_entry(io=io, discard_deleted=True)
        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id
    ]


def ref_change(intent: RefIntent, table: Table) -> tuple[tuple[TableUpdate, ...], tuple[TableRequirement, ...]]:
    """The metadata updates of ``intent`` and the requirements that make it a compare-and-swap on
    what ``table`` (the handle's metadata) shows."""
    match intent:
        case MoveRef(name, snapshot_id, expected, tag, drop):
            kind = SnapshotRefType.TAG if tag else SnapshotRefType.BRANCH
            update = SetSnapshotRefUpdate.model_validate({"ref-name": name, "type": kind, "snapshot-id": snapshot_id})
            if drop is None:
                return (update,), (ref_is(name, expected),)
            removal = RemoveSnapshotRefUpdate.model_validate({"ref-name": drop})
            return (update, removal), (ref_is(name, expected), ref_is(drop, snapshot_id))
        case RemoveRef(name, expected):
            return (RemoveSnapshotRefUpdate.model_validate({"ref-name": name}),), (ref_is(name, expected),)
        case Expire(snapshot_ids):
            # the catalog drops a ref that points at a removed snapshot, and pyiceberg's own expiry
            # requires only the table's UUID: without these a rollback, a replay or a tag that lands
            # meanwhile on a doomed snapshot would be silently erased with it
            refs = table.metadata.refs
            seen = tuple(ref_is(name, ref.snapshot_id) for name, ref in sorted(refs.items()))
            absent = tuple(ref_is(f"replay-{i}", None) for i in snapshot_ids if f"replay-{i}" not in refs)
            expiry = RemoveSnapshotsUpdate.model_validate({"snapshot-ids": list(snapshot_ids)})
            return (expiry,), (*seen, *absent)


def dead_letters_past(topics: Collection[str], to: Mapping[TopicPartition, int]) -> str:
    """Dead letters of ``topics`` at or past ``to`` (every one of a partition ``to`` does not name),
    as a row filter."""
    c = records.DEAD_LETTERS
    clauses = []
    for topic in sorted(topics):  # Kafka topic names are [a-zA-Z0-9._-]: nothing to escape
        known = sorted(tp.partition for tp in to if tp.topic == topic)
        per = [f"({c.partition} = {p} AND {c.offset} >= {to[TopicPartition(topic, p)]})" for p in known]
        if known:
            per.append(f"{c.partition} NOT IN ({', '.join(map(str, known))})")
            clauses.append(f"({c.topic} = '{topic}' AND ({' OR '.join(per)}))")
        else:
            clauses.append(f"{c.topic} = '{topic}'")
    return " OR ".join(clauses)


def in_spans(spans: Spans, c: records.Coordinates = records.DEAD_LETTERS) -> BooleanExpression:
    """Records in ``[start, end)`` offset ranges per partition (dead letters unless ``c`` names
    other coordinate columns), as an Iceberg row filter."""
    per_partition: list[BooleanExpression] = []
    for tp, ranges in sorted(spans.items()):
        singles = {lo for lo, hi in ranges if hi == lo + 1}
        wide: list[BooleanExpression] = [
            And(is_(GreaterThanOrEqual, c.offset, lo), is_(LessThan, c.offset, hi)) for lo, hi in ranges if hi > lo + 1
        ]
        if singles:
            wide.append(is_(In, c.offset, singles))
        if wide:
            where = And(is_(EqualTo, c.topic, tp.topic), is_(EqualTo, c.partition, tp.partition))
            per_partition.append(And(where, _any(wide)))
    return _any(per_partition) if per_partition else AlwaysFalse()


def is_(predicate: type[BooleanExpression], column: str, value: object) -> BooleanExpression:
    """``predicate(column, value)``: pyiceberg's predicates take these positionally at run time,
    where their typed signature (pydantic's) names other fields."""
    return predicate(column, value)  # type: ignore[call-arg]


def _any(clauses: Sequence[BooleanExpression]) -> BooleanExpression:
    """``Or`` of ``clauses`` as a balanced tree: pyiceberg binds and evaluates expressions
    recursively, and a chain of ~500 (one per offset range) exceeds Python's recursion limit."""
    if len(clauses) == 1:
        return clauses[0]
    middle = len(clauses) // 2
    return Or(_any(clauses[:middle]), _any(clauses[middle:]))


def ours(data_file: WrittenFile) -> DataFile:
    """A file this adapter wrote (:meth:`IcebergTable.write`), as pyiceberg's type again."""
    if not isinstance(data_file, DataFile):
        raise TypeError(f"{data_file!r} was not written by an Iceberg table; it cannot be committed to one")
    return data_file


def ref_is(name: str, snapshot_id: int | None) -> AssertRefSnapshotId:
    """Requirement: ref ``name`` points at ``snapshot_id`` (None: does not exist)."""
    return AssertRefSnapshotId.model_validate({"ref": name, "snapshot-id": snapshot_id})
