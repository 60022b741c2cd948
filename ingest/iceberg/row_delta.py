"""A changelog batch's commit on an Iceberg table (:class:`ingest.intents.RowDelta`): the live rows
of the keys it changes deleted by position delete files, its new rows added, in one snapshot, as
Iceberg's own row delta does. Position deletes, never equality deletes: every engine reads them
(pyiceberg among them), and a reader needs no join.

Which rows to delete is decided on the head the commit requires: the data files whose column
statistics may hold one of the keys are read (their key columns only), and a row is deleted if its
key is one of the batch's and no delete file deletes it already. One delete file per data file it
deletes from, its ``file_path`` bounds naming that file, so a reader matches it to that file alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles, _SnapshotProducer
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.types import LongType, StringType

from ingest.errors import TableMismatch
from ingest.intents import RowDelta

#: the reserved field ids of a position delete file's columns (Iceberg's spec)
FILE_PATH_ID, POS_ID = 2147483546, 2147483545
_POSITION = "__ingest_position"
_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)


def stage_row_delta(
    transaction: Transaction, intent: RowDelta, table: Table, branch: str, added: Sequence[DataFile]
) -> int:
    """Stage ``intent`` on ``branch`` of ``table`` (the handle's metadata) into ``transaction``: the
    position delete files of the rows it deletes on the branch head, written now, and ``added``."""
    head = table.metadata.refs.get(branch)
    deletes: list[DataFile] = []
    if head is not None and intent.deleted.num_rows:
        deletes = [
            write_position_deletes(table, data_file, positions)
            for data_file, positions in rows_to_delete(table, head.snapshot_id, intent.key, intent.deleted)
        ]
    operation = Operation.OVERWRITE if deletes and added else Operation.DELETE if deletes else Operation.APPEND
    producer = _RowDeltaProducer(
        operation, transaction, table.io, snapshot_properties=dict(intent.summary), branch=branch, deletes=deletes
    )
    with producer:
        for data_file in added:
            producer.append_data_file(data_file)
    return producer.snapshot_id


def rows_to_delete(
    table: Table, snapshot_id: int, key: Sequence[str], deleted: pa.Table
) -> Iterator[tuple[DataFile, pa.Array]]:
    """Per data file of snapshot ``snapshot_id`` that holds live rows whose ``key`` is a row of
    ``deleted``: their positions in the file, ascending."""
    wanted = deleted.select(list(key))
    for task in table.scan(snapshot_id=snapshot_id, row_filter=_bounds_of(wanted)).plan_files():
        if any(d.content == DataFileContent.EQUALITY_DELETES for d in task.delete_files):
            raise TableMismatch(
                f"{table.name()}: data file {task.file.file_path} has equality deletes (another writer, such as "
                "Flink's Iceberg sink, wrote them); a changelog pipeline writes position deletes only and cannot "
                "tell which rows they leave. Compact the table with Spark (rewrite_data_files) first, then run again."
            )
        found = _matching_positions(table, task, wanted)
        if len(found):
            yield task.file, found


def _bounds_of(keys: pa.Table) -> BooleanExpression:
    """A row filter no row of ``keys`` falls outside: each key column between its least and
    greatest value (what the data files' column statistics can rule out)."""
    where: BooleanExpression = AlwaysTrue()
    for name in keys.column_names:
        low, high = pc.min_max(keys[name]).values()
        if low.is_valid and isinstance(low.as_py(), int | str):  # (other types: no pruning)
            # (pyiceberg's predicates take these positionally; their typed signature names other fields)
            at_least = GreaterThanOrEqual(name, low.as_py())  # type: ignore[call-arg]
            at_most = LessThanOrEqual(name, high.as_py())  # type: ignore[call-arg]
            where = And(where, And(at_least, at_most))
    return where


def _matching_positions(table: Table, task: FileScanTask, wanted: pa.Table) -> pa.Array:
    """The positions in ``task``'s data file of live rows whose key is a row of ``wanted``."""
    names = wanted.column_names
    stored = _key_columns(table, task.file.file_path, names)
    stored = stored.append_column(_POSITION, pa.array(range(stored.num_rows), pa.int64()))
    matched = stored.join(wanted, names, join_type="inner")[_POSITION]
    positions = pc.unique(matched.combine_chunks())
    if task.delete_files and len(positions):
        gone = pa.chunked_array(
            [_deleted_positions(table, delete_file, task.file.file_path) for delete_file in task.delete_files],
            pa.int64(),
        )
        positions = positions.filter(pc.invert(pc.is_in(positions, gone)))
    return positions.take(pc.sort_indices(positions))


def _key_columns(table: Table, path: str, names: Sequence[str]) -> pa.Table:
    """Columns ``names`` of data file ``path``, found by field id (a renamed column is the same column)."""
    schema = table.schema()
    with table.io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = {
            int(field.metadata[b"PARQUET:field_id"]): field.name
            for field in parquet.schema_arrow
            if field.metadata and b"PARQUET:field_id" in field.metadata
        }
        columns = [by_id.get(schema.find_field(name).field_id) for name in names]
        if None in columns:
            raise TableMismatch(
                f"{table.name()}: data file {path} lacks key column(s) "
                f"{[n for n, c in zip(names, columns, strict=True) if c is None]}: a row of it cannot be matched "
                "to its key. The key columns must be in every data file of a changelog table."
            )
        data = parquet.read(columns=[c for c in columns if c is not None])
    return data.rename_columns(list(names))


def _deleted_positions(table: Table, delete_file: DataFile, path: str) -> pa.Array:
    with table.io.new_input(delete_file.file_path).open() as stream:
        data = pq.read_table(stream, columns=["file_path", "pos"])
    return data.filter(pc.equal(data["file_path"], path))["pos"].combine_chunks()


def write_position_deletes(table: Table, data_file: DataFile, positions: pa.Array) -> DataFile:
    """A position delete file deleting rows ``positions`` (ascending) of ``data_file``, in
    ``data_file``'s partition, its ``file_path`` bounds naming that file alone."""
    name = f"{uuid.uuid4()}-deletes.parquet"
    path = table.location_provider().new_data_location(name)
    rows = pa.table([pa.repeat(data_file.file_path, len(positions)), positions], schema=_DELETE_SCHEMA)
    with table.io.new_output(path).create(overwrite=True) as stream:
        pq.write_table(rows, stream)
    size = len(table.io.new_input(path))
    low, high = pc.min_max(positions).values()
    path_bound = to_bytes(StringType(), data_file.file_path)
    deletes = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=data_file.partition,
        record_count=len(positions),
        file_size_in_bytes=size,
        lower_bounds={FILE_PATH_ID: path_bound, POS_ID: to_bytes(LongType(), low.as_py())},
        upper_bounds={FILE_PATH_ID: path_bound, POS_ID: to_bytes(LongType(), high.as_py())},
    )
    deletes.spec_id = data_file.spec_id
    return deletes


class DeleteManifestWriter(ManifestWriterV2):
    """A manifest of delete files (pyiceberg writes data manifests only)."""

    @classmethod
    def of(cls, producer: _SnapshotProducer[Any], spec_id: int) -> DeleteManifestWriter:
        """A delete manifest of ``producer``'s snapshot, in partition spec ``spec_id``."""
        return cls(
            producer.spec(spec_id),
            producer.schema(),
            producer.new_manifest_output(),
            producer._snapshot_id,
            producer._compression,
        )

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDeltaProducer(_FastAppendFiles):
    """A fast append that also adds delete files, in delete manifests of their partition specs."""

    def __init__(
        self,
        operation: Operation,
        transaction: Transaction,
        io: object,
        *,
        snapshot_properties: dict[str, str],
        branch: str,
        deletes: Sequence[DataFile],
    ) -> None:
        super().__init__(operation, transaction, io, snapshot_properties=snapshot_properties, branch=branch)  # type: ignore[arg-type]
        self._deletes = list(deletes)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # the delete files counted as pyiceberg counts added files (added/total position deletes)
        added = self._added_data_files
        self._added_data_files = [*added, *self._deletes]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = added

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        by_spec: dict[int, list[DataFile]] = {}
        for delete_file in self._deletes:
            by_spec.setdefault(delete_file.spec_id, []).append(delete_file)
        for spec_id, files in by_spec.items():
            with DeleteManifestWriter.of(self, spec_id) as writer:
                for delete_file in files:
                    added = ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        data_file=delete_file,
                    )
                    writer.add(added)
            manifests.append(writer.to_manifest_file())
        return manifests
