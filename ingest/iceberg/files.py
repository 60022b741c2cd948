"""Reading a table's files for maintenance and publish: which data files a snapshot added, which
the head references, which lie in storage, and their rows."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus

from ingest.errors import TableMismatch
from ingest.iceberg.table import IcebergTable


def added_data_files(table: IcebergTable, snapshot_id: int) -> list[DataFile]:
    """The data files snapshot ``snapshot_id`` added (what re-applying it elsewhere needs)."""
    snapshot = table.table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return []
    io = table.table.io
    return [
        entry.data_file
        for manifest in snapshot.manifests(io=io)
        if manifest.content == ManifestContent.DATA and manifest.added_snapshot_id == snapshot_id
        for entry in manifest.fetch_manifest_entry(io=io, discard_deleted=True)
        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id
    ]


def live_files(table: IcebergTable) -> tuple[list[DataFile], int]:
    """Data files of the branch head, and how many delete files apply to them."""
    head = table.branch_head(table.branch)
    snapshot = table.table.metadata.snapshot_by_id(head) if head is not None else None
    if snapshot is None:
        return [], 0
    data: list[DataFile] = []
    deletes = 0
    for manifest in snapshot.manifests(io=table.table.io):
        entries = manifest.fetch_manifest_entry(io=table.table.io, discard_deleted=True)
        if manifest.content == ManifestContent.DATA:
            data.extend(entry.data_file for entry in entries)
        else:
            deletes += len(entries)
    return data, deletes


def live_data_files(table: IcebergTable) -> list[DataFile]:
    """Data files of the branch head."""
    return live_files(table)[0]


def referenced_paths(table: IcebergTable) -> set[str]:
    """Every data file any remaining snapshot references."""
    return set(table.table.inspect.all_files()["file_path"].to_pylist())


def stored_data_files(table: IcebergTable) -> list[tuple[str, float]]:
    """(path, modified-at seconds) of every file under the table's data directory."""
    from pyarrow.fs import FileSelector, FileType

    location = table.table.location().rstrip("/") + "/data"
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    io = table.table.io
    fs = io.fs_by_scheme(scheme, netloc) if isinstance(io, PyArrowFileIO) else None
    if fs is None:
        raise TableMismatch(f"orphan-file removal needs pyarrow file IO for {location}")
    prefix = f"{scheme}://{netloc}" if netloc else f"{scheme}://"
    found = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return [(prefix + info.path, info.mtime.timestamp()) for info in found if info.type == FileType.File]


def delete_file(table: IcebergTable, path: str) -> None:
    table.table.io.delete(path)


def read_files(table: IcebergTable, files: Sequence[DataFile]) -> pa.Table:
    import pyarrow.parquet as pq

    tables = []
    for data_file in files:
        with table.table.io.new_input(data_file.file_path).open() as stream:
            tables.append(pq.read_table(stream))
    return pa.concat_tables(tables, promote_options="permissive")
