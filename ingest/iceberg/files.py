"""Reading a table's files for maintenance and publish: which data files a snapshot added, which
the head references, which lie in storage, and their rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import urlparse

import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import FileScanTask
from pyiceberg.types import StringType

from ingest.errors import TableMismatch
from ingest.iceberg.row_delta import FILE_PATH_ID
from ingest.iceberg.table import IcebergTable


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
    try:
        return set(table.table.inspect.all_files()["file_path"].to_pylist())
    except pa.ArrowInvalid as error:  # pyiceberg concatenates no tables when no snapshot holds a file
        if "at least one table" not in str(error):
            raise
        return set()


def stored_data_files(table: IcebergTable) -> list[tuple[str, float]]:
    """(path, modified-at seconds) of every file under the table's data directory, each path
    spelled as the table's location spells it."""
    from pyarrow.fs import FileSelector, FileType

    location = table.table.location().rstrip("/") + "/data"
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    io = table.table.io
    fs = io.fs_by_scheme(scheme, netloc) if isinstance(io, PyArrowFileIO) else None
    if fs is None:
        raise TableMismatch(f"orphan-file removal needs pyarrow file IO for {location}")
    # pyarrow names a file as it was asked for the directory: the bucket first on S3, the bare path
    # on a local disk or HDFS. What follows the directory is the file's own part of the path.
    base = path.rstrip("/")
    found = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
    return [
        (location + info.path[len(base) :], info.mtime.timestamp())
        for info in found
        if info.type == FileType.File and info.path.startswith(base + "/")
    ]


#: schemes that name one store: Hadoop's s3a and s3n and Iceberg's s3 reach the same objects
_SAME_STORE = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "wasbs": "wasb"}


def path_key(path: str) -> str:
    """A file's path as a comparison key: ``s3a://b/k`` and ``s3://b/k`` are one object, and
    ``/x``, ``file:/x`` and ``file:///x`` one file (Java writers spell local paths either way)."""
    parsed = urlparse(path)
    scheme = _SAME_STORE.get(parsed.scheme, parsed.scheme or "file")
    return f"{scheme}://{parsed.netloc}{parsed.path}"


def unreferenced(stored: Iterable[str], referenced: Iterable[str]) -> list[str]:
    """The stored paths no snapshot references. A stored file that a snapshot names under another
    authority (another bucket, host or account, same path) is not an orphan but a table whose files
    this listing cannot match: refuse, as Iceberg's own orphan removal does, rather than delete it."""
    keys = {path_key(path) for path in referenced}
    bare = {urlparse(key).path: key for key in keys}
    orphans = []
    for path in stored:
        key = path_key(path)
        if key in keys:
            continue
        other = bare.get(urlparse(key).path)
        if other is not None:
            raise TableMismatch(
                f"orphan-file removal found {path} stored, and a snapshot referencing {other}: the same "
                "path under another scheme or authority. Nothing was deleted; check the table's location "
                "and the catalog's file IO settings."
            )
        orphans.append(path)
    return orphans


def delete_file(table: IcebergTable, path: str) -> None:
    table.table.io.delete(path)


def read_files(table: IcebergTable, files: Sequence[DataFile]) -> pa.Table:
    import pyarrow.parquet as pq

    tables = []
    for data_file in files:
        with table.table.io.new_input(data_file.file_path).open() as stream:
            tables.append(pq.read_table(stream))
    return pa.concat_tables(tables, promote_options="permissive")


class EqualityDeletes(Exception):
    """The table has equality deletes: its live rows are not known by position."""


def scan_tasks(table: IcebergTable) -> dict[str, FileScanTask]:
    """Per data file of the branch head (by path), its scan task: the file and the position delete
    files that apply to it. Raises :class:`EqualityDeletes` if any equality delete applies."""
    head = table.branch_head(table.branch)
    if head is None:
        return {}
    tasks: dict[str, FileScanTask] = {}
    for task in table.table.scan(snapshot_id=head).plan_files():
        if any(d.content == DataFileContent.EQUALITY_DELETES for d in task.delete_files):
            raise EqualityDeletes(task.file.file_path)
        tasks[task.file.file_path] = task
    return tasks


def read_live(table: IcebergTable, tasks: Sequence[FileScanTask]) -> pa.Table:
    """The live rows of the data files of ``tasks`` (:func:`scan_tasks`), their deletes applied."""
    metadata = table.table.metadata
    return ArrowScan(metadata, table.table.io, metadata.schema(), AlwaysTrue()).to_table(tasks)


def removable(deletes: Sequence[DataFile], removed: Sequence[DataFile]) -> list[DataFile]:
    """The delete files of ``deletes`` that name data files of ``removed`` alone (their
    ``file_path`` bounds are one removed file)."""
    gone = {f.file_path for f in removed}
    unique: dict[str, DataFile] = {}
    for delete_file in deletes:
        low = (delete_file.lower_bounds or {}).get(FILE_PATH_ID)
        high = (delete_file.upper_bounds or {}).get(FILE_PATH_ID)
        if low is not None and low == high and from_bytes(StringType(), low) in gone:
            unique[delete_file.file_path] = delete_file
    return list(unique.values())
