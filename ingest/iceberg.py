"""Iceberg adapter: the only module that imports pyiceberg (with :mod:`ingest.held_catalog`,
imported only once an SQL catalog is opened: workers write files and need no SQLAlchemy).

It turns the catalog into what the protocol needs: the branch head and its ancestry as
:class:`~ingest.core.ledger.SnapshotView`, Parquet data files written under unique names, and one
commit attempt that either lands, conflicts, or has an unknown outcome. It never retries a commit
itself, and it makes sure pyiceberg does not either (``commit.retry.num-retries=0``): pyiceberg's
own retry rebases an append onto the new head and lands a second copy of the batch.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io.pyarrow import PyArrowFileIO, _check_pyarrow_schema_compatible, _dataframe_to_data_files
from pyiceberg.manifest import DataFile as DataFile  # re-exported: engines pass these around
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from ingest import nogc
from ingest.config import TRANSFORM, FieldSpec
from ingest.core.ledger import SnapshotView
from ingest.errors import CatalogUnavailable, ConfigError, TableMismatch

log = logging.getLogger(__name__)

NO_LIBRARY_RETRIES = {"commit.retry.num-retries": "0"}
MAIN = "main"
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def _iceberg_type(name: str) -> IcebergType:
    match = _DECIMAL.fullmatch(name)
    if match:
        return DecimalType(int(match.group(1)), int(match.group(2)))
    return {
        "boolean": BooleanType(),
        "int": IntegerType(),
        "long": LongType(),
        "float": FloatType(),
        "double": DoubleType(),
        "date": DateType(),
        "timestamp": TimestampType(),
        "timestamptz": TimestamptzType(),
        "string": StringType(),
        "binary": BinaryType(),
    }[name]


def rows_schema(fields: Sequence[FieldSpec]) -> Schema:
    kafka = [
        NestedField(1, "_kafka_topic", StringType(), required=True),
        NestedField(2, "_kafka_partition", IntegerType(), required=True),
        NestedField(3, "_kafka_offset", LongType(), required=True),
        NestedField(4, "_kafka_timestamp", TimestamptzType(), required=False),
        NestedField(5, "_kafka_key", BinaryType(), required=False),
    ]
    declared = [
        NestedField(6 + i, f.name, _iceberg_type(f.type), required=f.required, doc=f.doc) for i, f in enumerate(fields)
    ]
    return Schema(*kafka, *declared)


def dead_letter_schema() -> Schema:
    header = StructType(
        NestedField(10, "key", StringType(), required=True),
        NestedField(11, "value", BinaryType(), required=False),
    )
    return Schema(
        NestedField(1, "topic", StringType(), required=True),
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "offset", LongType(), required=True),
        NestedField(4, "timestamp", TimestamptzType(), required=False),
        NestedField(5, "key", BinaryType(), required=False),
        NestedField(6, "value", BinaryType(), required=False),
        NestedField(7, "headers", ListType(9, header, element_required=True), required=False),
        NestedField(8, "error", StringType(), required=True),
    )


def partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    if not partition_by:
        return UNPARTITIONED_PARTITION_SPEC
    fields = []
    for i, item in enumerate(partition_by):
        match = TRANSFORM.match(item.replace(" ", ""))
        assert match is not None  # validated in config
        fn = match.group("fn") or match.group("wfn") or "identity"
        n, column = match.group("n"), match.group("col") or match.group("wcol") or match.group("bare")
        transform: Transform[Any, Any]
        if fn in ("bucket", "truncate"):
            transform = BucketTransform(int(n)) if fn == "bucket" else TruncateTransform(int(n))
            name = f"{column}_{fn}_{n}"
        else:
            transform = {
                "identity": IdentityTransform(),
                "year": YearTransform(),
                "month": MonthTransform(),
                "day": DayTransform(),
                "hour": HourTransform(),
            }[fn]
            name = column if fn == "identity" else f"{column}_{fn}"
        source = schema.find_field(column)
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=name))
    return PartitionSpec(*fields)


def connect(properties: Mapping[str, str]) -> Catalog:
    props = dict(properties)
    name = props.pop("name")
    try:
        catalog = load_catalog(name, **props)
        if type(catalog).__module__ == "pyiceberg.catalog.sql":  # SqlCatalog: its module is loaded now
            from ingest.held_catalog import HeldSqlCatalog

            catalog.engine.dispose()  # type: ignore[attr-defined]
            catalog = HeldSqlCatalog(catalog.name, **catalog.properties)
        return catalog
    except (ValueError, NotImplementedError) as error:
        raise ConfigError(f"catalog: {error}") from None
    except Exception as error:  # driver errors of every catalog backend
        raise CatalogUnavailable(f"cannot open Iceberg catalog {name!r}: {error}") from None


class CommitConflict(Exception):
    """The catalog refused the commit: the branch head was no longer the snapshot we required."""


class CommitUnknown(Exception):
    """The commit attempt failed in a way that does not say whether it was applied."""


@dataclass(frozen=True)
class Head:
    snapshot_id: int | None
    properties: Mapping[str, str]


class IcebergTable:
    """One Iceberg table as the protocol uses it (main branch)."""

    def __init__(
        self, catalog: Catalog, identifier: str, table: Table, branch: str = MAIN, loaded_at: float = -math.inf
    ) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.branch = branch
        self._table = table
        #: when the held metadata was loaded from the catalog (monotonic); a commit through this
        #: handle resets it: a handle that keeps committing (``run --every``, a run loop) while
        #: another writer commits too must not plan from its own last commit and redo their batch
        self._loaded_at = loaded_at

    def on_branch(self, branch: str) -> IcebergTable:
        """The same table, reading and committing on ``branch``."""
        return IcebergTable(self.catalog, self.identifier, self._table, branch)

    def detached(self) -> IcebergTable:
        """A copy that only writes data files: it holds no catalog connection, so it pickles (Spark
        ships it to executors)."""
        table = copy.copy(self._table)
        table.catalog = None  # type: ignore[assignment]
        return IcebergTable(None, self.identifier, table, self.branch)  # type: ignore[arg-type]

    @classmethod
    def open(
        cls,
        catalog: Catalog,
        identifier: str,
        schema: Schema,
        spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
    ) -> IcebergTable:
        """Load the table, creating it (and its namespace) if missing; adopt it for exact commits."""
        try:
            table = _load_or_create(catalog, identifier, schema, spec)
        except (ConfigError, TableMismatch):
            raise
        except Exception as error:
            raise CatalogUnavailable(f"cannot load or create table {identifier}: {error}") from None
        _check_compatible(identifier, table, schema)
        if table.properties.get("commit.retry.num-retries") != "0":
            log.info("setting commit.retry.num-retries=0 on %s (library retries duplicate batches)", identifier)
            table = table.transaction().set_properties(NO_LIBRARY_RETRIES).commit_transaction()
        return cls(catalog, identifier, table, loaded_at=time.monotonic())

    @property
    def table(self) -> Table:
        return self._table

    def refresh(self, max_age_s: float = 0.0) -> Head:
        """The branch head after loading the metadata again, unless what the handle holds came
        from the catalog less than ``max_age_s`` ago."""
        if time.monotonic() - self._loaded_at < max_age_s:
            return self.head()
        try:
            with nogc.paused():  # pydantic builds an object per snapshot, summary and log entry
                self._table = self._table.refresh()
        except Exception as error:
            raise CatalogUnavailable(f"cannot refresh table {self.identifier}: {error}") from None
        self._loaded_at = time.monotonic()
        return self.head()

    def head(self) -> Head:
        return Head(self.branch_head(self.branch), dict(self._table.properties))

    def branch_head(self, branch: str) -> int | None:
        ref = self._table.metadata.refs.get(branch)
        return ref.snapshot_id if ref is not None else None

    def ancestry(self, start: int | None = None) -> Iterator[SnapshotView]:
        """Snapshots from the branch head (or ``start``) back through parent links, until the chain
        ends or breaks."""
        metadata = self._table.metadata
        snapshot_id = start if start is not None else self.branch_head(self.branch)
        seen: set[int] = set()
        while snapshot_id is not None and snapshot_id not in seen:
            seen.add(snapshot_id)
            snapshot = metadata.snapshot_by_id(snapshot_id)
            if snapshot is None:  # parent expired: the chain is broken here
                return
            summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
            yield SnapshotView(snapshot_id, dict(summary), snapshot.timestamp_ms)
            snapshot_id = snapshot.parent_snapshot_id

    def all_snapshots(self) -> list[SnapshotView]:
        return [
            SnapshotView(s.snapshot_id, dict(s.summary.additional_properties if s.summary else {}), s.timestamp_ms)
            for s in self._table.metadata.snapshots
        ]

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[DataFile]:
        """Parquet files under unique names in the table location; invisible until committed."""
        if data.num_rows == 0:
            return []
        metadata = self._table.metadata
        if target_file_bytes is not None:
            properties = {**metadata.properties, "write.target-file-size-bytes": str(target_file_bytes)}
            metadata = metadata.model_copy(update={"properties": properties})
        try:
            return list(_dataframe_to_data_files(metadata, data, self._table.io, write_uuid=uuid.uuid4()))
        except OSError as error:
            raise CatalogUnavailable(f"writing data files for {self.identifier} failed: {error}") from None

    def try_commit(self, files: Sequence[DataFile], summary: Mapping[str, str], properties: Mapping[str, str]) -> int:
        """One commit attempt: a snapshot with ``files`` and ``summary``, requiring the current head.

        Returns the new snapshot id. Raises :class:`CommitConflict` if the head moved and
        :class:`CommitUnknown` for any failure that leaves the outcome open.
        """
        with nogc.paused():  # the catalog loads, deep-copies and writes the whole metadata
            transaction = self._head_only().transaction()
            if properties:
                transaction.set_properties(dict(properties))
            snapshot = transaction.update_snapshot(snapshot_properties=dict(summary), branch=self.branch)
            with snapshot.fast_append() as append:
                for data_file in files:
                    append.append_data_file(data_file)
                snapshot_id = append.snapshot_id
            self._commit(transaction)
        return snapshot_id

    def _head_only(self) -> Table:
        """This table with its metadata cut to the branch head: what an append to that head needs.

        pyiceberg's ``Transaction`` re-derives, and deep-copies, the whole table metadata each time
        it reads it (about fifteen times per append), so an append's cost grew with the number of
        snapshots (~1 s at 1,000). An append reads only the head snapshot (its manifest list and
        summary totals), the schema, spec and properties; the catalog applies the resulting
        updates to its own, complete metadata under the same head requirement, so the committed
        table is the same. The handle returned by the commit holds the catalog's full metadata.
        """
        metadata = self._table.metadata
        head = self.branch_head(self.branch)
        lean = metadata.model_copy(
            update={
                "snapshots": [s for s in metadata.snapshots if s.snapshot_id == head],
                "refs": {self.branch: metadata.refs[self.branch]} if head is not None else {},
                "snapshot_log": [],
                "metadata_log": [],
            }
        )
        table = self._table
        return Table(table.name(), lean, table.metadata_location, table.io, table.catalog, table.config)

    def _commit(self, transaction: Transaction) -> None:
        """Commit with the catalog's own requirements; map the outcome to conflict or unknown."""
        try:
            self._table = transaction.commit_transaction()
            self._loaded_at = -math.inf
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from None
        except Exception as error:
            raise CommitUnknown(f"{type(error).__name__}: {error}") from None

    def create_branch(self, name: str, snapshot_id: int) -> None:
        try:
            self._table.manage_snapshots().create_branch(snapshot_id, name).commit()
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from None

    def set_main(self, snapshot_id: int) -> None:
        """Point main at ``snapshot_id``, requiring main's head to be what this handle last saw."""
        try:
            self._table.manage_snapshots().set_current_snapshot(snapshot_id=snapshot_id).commit()
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from None

    def snapshot_summary(self, snapshot_id: int) -> dict[str, str] | None:
        snapshot = self._table.metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            return None
        return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}

    def snapshot_as_of(self, timestamp_ms: int) -> int | None:
        """The main branch's snapshot current at ``timestamp_ms`` (from the snapshot log)."""
        current = None
        for entry in self._table.metadata.snapshot_log:
            if entry.timestamp_ms <= timestamp_ms:
                current = entry.snapshot_id
        return current

    # --- maintenance -------------------------------------------------------------------------

    def expire(self, snapshot_ids: Sequence[int]) -> None:
        if not snapshot_ids:
            return
        try:
            self._table.maintenance.expire_snapshots().by_ids(list(snapshot_ids)).commit()
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from None

    def live_data_files(self) -> list[DataFile]:
        """Data files of the branch head."""
        head = self.branch_head(self.branch)
        snapshot = self._table.metadata.snapshot_by_id(head) if head is not None else None
        if snapshot is None:
            return []
        return [
            entry.data_file
            for manifest in snapshot.manifests(io=self._table.io)
            for entry in manifest.fetch_manifest_entry(io=self._table.io, discard_deleted=True)
        ]

    def referenced_paths(self) -> set[str]:
        """Every data file any remaining snapshot references."""
        return set(self._table.inspect.all_files()["file_path"].to_pylist())

    def stored_data_files(self) -> list[tuple[str, float]]:
        """(path, modified-at seconds) of every file under the table's data directory."""
        from pyarrow.fs import FileSelector, FileType

        location = self._table.location().rstrip("/") + "/data"
        scheme, netloc, path = PyArrowFileIO.parse_location(location)
        io = self._table.io
        fs = io.fs_by_scheme(scheme, netloc) if isinstance(io, PyArrowFileIO) else None
        if fs is None:
            raise TableMismatch(f"orphan-file removal needs pyarrow file IO for {location}")
        prefix = f"{scheme}://{netloc}" if netloc else f"{scheme}://"
        found = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
        return [(prefix + info.path, info.mtime.timestamp()) for info in found if info.type == FileType.File]

    def delete_file(self, path: str) -> None:
        self._table.io.delete(path)

    def read_files(self, files: Sequence[DataFile]) -> pa.Table:
        import pyarrow.parquet as pq

        tables = []
        for data_file in files:
            with self._table.io.new_input(data_file.file_path).open() as stream:
                tables.append(pq.read_table(stream))
        return pa.concat_tables(tables, promote_options="permissive")

    def rewrite(self, remove: Sequence[DataFile], add: Sequence[DataFile], summary: Mapping[str, str]) -> int:
        """Replace ``remove`` by ``add`` in one snapshot, requiring the current head (CAS)."""
        transaction = self._table.transaction()
        with transaction.update_snapshot(snapshot_properties=dict(summary), branch=self.branch).overwrite() as ow:
            for data_file in remove:
                ow.delete_data_file(data_file)
            for data_file in add:
                ow.append_data_file(data_file)
            snapshot_id = ow.snapshot_id
        self._commit(transaction)
        return snapshot_id

    def scan_columns(self, columns: Sequence[str], snapshot_id: int | None = None) -> pa.Table:
        if snapshot_id is None:
            snapshot_id = self.branch_head(self.branch)
            if snapshot_id is None:
                return self._table.schema().as_arrow().empty_table().select(list(columns))
        return self._table.scan(selected_fields=tuple(columns), snapshot_id=snapshot_id).to_arrow()


def _load_or_create(catalog: Catalog, identifier: str, schema: Schema, spec: PartitionSpec) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:  # SqlCatalog checks, then inserts: a concurrent copy can win in between
        if not catalog.namespace_exists(namespace):
            raise
    try:
        return catalog.create_table(identifier, schema=schema, partition_spec=spec, properties=NO_LIBRARY_RETRIES)
    except TableAlreadyExistsError:  # a concurrent copy of the pipeline created it first
        return catalog.load_table(identifier)


def _check_compatible(identifier: str, table: Table, schema: Schema) -> None:
    try:
        _check_pyarrow_schema_compatible(table.schema(), schema.as_arrow())
    except ValueError as error:
        raise TableMismatch(
            f"table {identifier} exists with a schema that does not fit the configured one: {error}\n"
            "Fix `schema:` to match the table, or evolve the table's schema first."
        ) from None
