"""Reading an Iceberg table beyond what the batch loop reads: snapshot summaries and the snapshot
log, branches and tags, a table's dead letters, and data files written and not committed yet (what
operations and ``verify`` look at)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import In
from pyiceberg.table.refs import SnapshotRefType

from ingest import records
from ingest.core.expiry import Ref
from ingest.core.ledger import SnapshotView
from ingest.iceberg.commits import is_
from ingest.iceberg.table import IcebergTable, snapshot_view


def all_snapshots(table: IcebergTable) -> list[SnapshotView]:
    return [snapshot_view(s) for s in table.table.metadata.snapshots]


def refs(table: IcebergTable) -> list[Ref]:
    """Every branch and tag, as the handle last read them."""
    return [
        Ref(name, ref.snapshot_id, ref.snapshot_ref_type == SnapshotRefType.BRANCH)
        for name, ref in sorted(table.table.metadata.refs.items())
    ]


def read_written(table: IcebergTable, paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """``columns`` of data files :meth:`write` wrote and no snapshot references yet."""
    files = table.adopt(paths)
    arrow = table.table.schema().as_arrow()
    schema = pa.schema([arrow.field(c) for c in columns])
    tables = [schema.empty_table()]
    for data_file in files:
        with table.table.io.new_input(data_file.file_path).open() as stream:
            tables.append(pq.read_table(stream, columns=list(columns)).cast(schema))
    return pa.concat_tables(tables)


def snapshot_summary(table: IcebergTable, snapshot_id: int) -> dict[str, str] | None:
    snapshot = table.table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return None
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


def snapshot_as_of(table: IcebergTable, timestamp_ms: int) -> int | None:
    """The main branch's snapshot current at ``timestamp_ms`` (from the snapshot log)."""
    current = None
    for entry in table.table.metadata.snapshot_log:
        if entry.timestamp_ms <= timestamp_ms:
            current = entry.snapshot_id
    return current


def dead_letters_of(table: IcebergTable, topics: Collection[str], columns: Sequence[str] | None = None) -> pa.Table:
    """The dead letters of ``topics`` on the branch head (``columns`` of the dead-letter table; all by default)."""
    head = table.branch_head(table.branch)
    if head is None or not topics:
        empty = table.table.schema().as_arrow().empty_table()
        return empty.select(list(columns)) if columns else empty
    return table.table.scan(
        row_filter=is_(In, records.DEAD_LETTERS.topic, set(topics)),
        snapshot_id=head,
        selected_fields=tuple(columns) if columns else ("*",),
    ).to_arrow()
