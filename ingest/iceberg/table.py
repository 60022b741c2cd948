"""An Iceberg table as the protocol uses it: the ledger-bearing branch head, data files written
under unique names, and commits that are compare-and-swaps (SQLAlchemy is imported only once an SQL
catalog is opened, by :mod:`ingest.iceberg.held_catalog`: workers write files and need no database).

It turns the catalog into what the protocol needs: the branch head and its ancestry as
:class:`~ingest.core.ledger.SnapshotView`, Parquet data files written under unique names, and one
commit attempt that either lands, conflicts, or has an unknown outcome.

Every commit made here is a compare-and-swap on what the handle read: appends and rewrites require
the branch head, ref moves require the ref's old target, expiry requires every ref it saw. None
is ever retried by the library: pyiceberg's own retry rebases an append onto the new head and lands
a second copy of the batch, and it reads ``commit.retry.num-retries`` from the table's properties,
which any other writer may change. So each commit is built on metadata whose properties say
``0`` (:func:`~ingest.iceberg.commits.without_library_retries`), whatever the table's own properties say.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

import pyarrow as pa
from pyiceberg.catalog import Catalog as Catalog  # re-exported: a pipeline's layout names these
from pyiceberg.exceptions import (
    CommitFailedException,
)
from pyiceberg.io.pyarrow import (
    _dataframe_to_data_files,
    parquet_file_to_data_file,
)
from pyiceberg.manifest import DataFile as DataFile  # re-exported: engines pass these around
from pyiceberg.partitioning import PartitionSpec as PartitionSpec
from pyiceberg.schema import Schema as Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import AssertTableUUID, TableRequirement, TableUpdate

from ingest import nogc, records
from ingest.core.expiry import MAIN as MAIN  # re-exported: the branch every run commits to
from ingest.core.ledger import SnapshotView, TopicPartition
from ingest.core.ledger_codec import PIPELINE_TABLE_PROPERTIES
from ingest.errors import (
    BranchGone,
    CatalogUnavailable,
    CommitConflict,
    CommitUnknown,
    SchemaMoved,
    WrittenFilesGone,
)
from ingest.iceberg.commits import (
    files_added,
    head_only,
    in_spans,
    ref_change,
    refused_as_conflict,
    stage,
    without_library_retries,
)
from ingest.iceberg.schema import (
    describe_change,
    rows_schema,
    sort_keys,
    sorted_by,
    stage_evolution,
)
from ingest.intents import Append, Expire, MoveRef, Reapply, RefIntent, RemoveRef, SnapshotIntent
from ingest.intents import DataFile as WrittenFile
from ingest.ports import Head, TableShape
from ingest.records import Declared

log = logging.getLogger(__name__)

NO_LIBRARY_RETRIES = PIPELINE_TABLE_PROPERTIES
#: the catalog properties a file IO needs to write data files (what crosses to workers and executors)
STORAGE_PROPERTIES = ("s3.", "gcs.", "adls.", "hdfs.", "hf.", "oss.", "client.", "pyarrow.", "py-io-impl")


class IcebergTable:
    """One Iceberg table as the protocol uses it (main branch)."""

    def __init__(
        self,
        catalog: Catalog,
        identifier: str,
        table: Table,
        branch: str = MAIN,
        loaded_at: float = -math.inf,
        renames: Mapping[str, str] | None = None,
    ) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.branch = branch
        self._table = table
        #: when the held metadata was loaded from the catalog (monotonic); a commit through this
        #: handle resets it: a handle that keeps committing (``run --every``, a run loop) while
        #: another writer commits too must not plan from its own last commit and redo their batch
        self._loaded_at = loaded_at
        #: the schema records are written in, when the table's must evolve to take it: every commit
        #: through this handle carries that evolution (see :meth:`evolve_to`)
        self._wanted: Schema | None = None
        #: the schema data files were last written with while evolving (held metadata, evolved)
        self._written_with: Schema | None = None
        #: the held metadata the evolved one for writes was derived from, and that evolved metadata
        self._for_writes: tuple[TableMetadata, TableMetadata] | None = None
        #: top-level columns the evolution renames first, old name → new (``renames:``)
        self._renames: dict[str, str] = dict(renames or {})
        #: the partition spec data files were last written under, through this handle or its
        #: detached copies (files crossing processes lose their own spec id)
        self._files_spec: int | None = None
        #: what :meth:`_evolve_to` last decided on: the held schema's id and the wanted schema
        self._decided: tuple[int, Schema] | None = None

    def on_branch(self, branch: str) -> IcebergTable:
        """The same table, reading and committing on ``branch``."""
        handle = IcebergTable(self.catalog, self.identifier, self._table, branch)
        handle._wanted, handle._renames = self._wanted, self._renames
        return handle

    def evolve_to(self, fields: Sequence[Declared]) -> None:
        """Write records of the rows table's ``fields`` from now on, evolving the table's schema to
        take them in the same commit as the first data written so (never alone: a crash leaves
        neither a schema without its data nor data without its schema). Raises
        :class:`TableMismatch` where the table cannot evolve so."""
        self.take_schema(rows_schema(fields))

    def take_schema(self, schema: Schema) -> None:
        """Write rows of ``schema`` from now on (see :meth:`evolve_to`); :class:`TableMismatch` where
        the table's schema cannot evolve to take it."""
        decided = (self._table.metadata.current_schema_id, schema)
        if decided == self._decided:  # (a routed table is checked before every batch: each staging copies metadata)
            return
        transaction = self._table.transaction()
        before = transaction.table_metadata.schema()
        if stage_evolution(transaction, self.identifier, schema, self._renames):
            change = describe_change(before, transaction.table_metadata.schema())
            log.info("%s: the next commit evolves the schema: %s", self.identifier, change)
            self._wanted = schema
        else:
            self._wanted = None
        self._decided = decided

    def _metadata_for_writes(self) -> TableMetadata:
        """The held metadata, with the schema evolved to the wanted one if it must be.

        Derived once per held metadata (a transaction copies the whole metadata to stage the
        change; files are written chunk by chunk). Once the held schema already takes the wanted
        one (this handle's commit carried the evolution, or another writer's did), the handle
        writes and commits as if it never had to evolve."""
        held = self._table.metadata
        if self._wanted is None:
            return held
        if self._for_writes is not None and self._for_writes[0] is held:
            return self._for_writes[1]
        transaction = self._table.transaction()
        if not stage_evolution(transaction, self.identifier, self._wanted, self._renames):
            self._wanted = self._written_with = self._for_writes = None
            return held
        metadata = transaction.table_metadata
        self._written_with, self._for_writes = metadata.schema(), (held, metadata)
        return metadata

    def _transaction(self, metadata: TableMetadata | None = None) -> Transaction:
        """A transaction for one commit on ``metadata`` (default: what the handle holds), with the
        library's retries off and the schema evolution staged first. Raises :class:`SchemaMoved`
        if files were written with an evolved schema this commit would not give the table."""
        transaction = without_library_retries(self._table, metadata).transaction()
        if self._wanted is not None:
            stage_evolution(transaction, self.identifier, self._wanted, self._renames)
            if self._written_with is not None and transaction.table_metadata.schema() != self._written_with:
                raise SchemaMoved(
                    f"the schema of {self.identifier} changed while this batch's files were written with an "
                    "evolved one (another writer changed the table); nothing was committed. Run again: the "
                    "next batch is written for the table's new schema."
                )
        return transaction

    def detached(self) -> IcebergTable:
        """A copy that only writes data files, for worker processes and Spark executors: no catalog
        connection, and a file IO that holds only the storage properties (``s3.*``, ``gcs.*``,
        ``adls.*``, ``client.*``…), never the catalog's (its URI, user, password, token)."""
        table = copy.copy(self._table)
        table.metadata = self._metadata_for_writes()
        self._files_spec = table.metadata.default_spec_id
        table.catalog = None  # type: ignore[assignment]
        io = table.io
        table.io = type(io)(properties={k: v for k, v in io.properties.items() if k.startswith(STORAGE_PROPERTIES)})
        return IcebergTable(None, self.identifier, table, self.branch)  # type: ignore[arg-type]

    @property
    def table(self) -> Table:
        return self._table

    def shape(self) -> TableShape:
        """The table as lineage describes it (its schema as held, its branch's head)."""
        table = self._table
        columns = tuple((field.name, str(field.field_type)) for field in table.schema().fields)
        return TableShape(self.identifier, table.location(), columns, self.head().snapshot_id)

    @property
    def renames(self) -> Mapping[str, str]:
        """Top-level columns the next commit's schema evolution renames first, old name → new."""
        return self._renames

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
        if self.branch != MAIN and self.branch not in self._table.metadata.refs:
            raise BranchGone(
                f"branch {self.branch} of {self.identifier} no longer exists: another `ingest replay --publish` "
                "published it meanwhile, or it was dropped. Nothing of this command reached main; run it again "
                "to replay anew (or see `ingest history` for what main holds now)."
            )
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
            yield snapshot_view(snapshot)
            snapshot_id = snapshot.parent_snapshot_id

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[WrittenFile]:
        """Parquet files under unique names in the table location; invisible until committed."""
        if data.num_rows == 0:
            return []
        metadata = self._metadata_for_writes()
        self._files_spec = metadata.default_spec_id
        keys = sort_keys(metadata.schema(), metadata.sort_order())
        if keys:  # each file sorted as the table's sort order says (ours, or one another tool set)
            data = sorted_by(data, keys)
        if target_file_bytes is not None:
            properties = {**metadata.properties, "write.target-file-size-bytes": str(target_file_bytes)}
            metadata = metadata.model_copy(update={"properties": properties})
        try:
            return list(_dataframe_to_data_files(metadata, data, self._table.io, write_uuid=uuid.uuid4()))
        except OSError as error:
            raise CatalogUnavailable(f"writing data files for {self.identifier} failed: {error}") from None

    def adopt(self, paths: Sequence[str]) -> list[WrittenFile]:
        """Data files :meth:`write` wrote earlier (maybe in a process that is gone), as they can be
        committed now: each file's record count, size and column statistics read from its Parquet
        footer (as pyiceberg's ``add_files`` does)."""
        io, metadata = self._table.io, self._table.metadata
        adopted: list[WrittenFile] = []
        for path in paths:
            try:
                adopted.append(parquet_file_to_data_file(io, metadata, path))
            except FileNotFoundError:
                raise WrittenFilesGone(
                    f"{self.identifier}: data file {path} is no longer stored, although a committed snapshot "
                    "names it as still to be added. Something deleted it (by hand, or another tool's orphan-file "
                    "removal). Restore it from a backup of the warehouse, or ask for help: its records are named "
                    "by the snapshot's ledger and are still in Kafka while retention keeps them."
                ) from None
            except OSError as error:
                raise CatalogUnavailable(f"{self.identifier}: cannot read data file {path}: {error}") from None
        return adopted

    @overload
    def commit(self, intent: SnapshotIntent) -> int: ...

    @overload
    def commit(self, intent: RefIntent) -> None: ...

    def commit(self, intent: SnapshotIntent | RefIntent) -> int | None:
        """One compare-and-swap commit of ``intent`` (see :mod:`ingest.intents`, built by
        :mod:`ingest.iceberg.commits`): a snapshot on the branch, requiring its head, or a change of
        refs, requiring what the handle saw of them. Returns the new snapshot's id (None for a ref
        intent). Raises :class:`CommitConflict` if what it requires moved (nothing applied) and
        :class:`CommitUnknown` for any failure that leaves the outcome open."""
        if isinstance(intent, Expire) and not intent.snapshot_ids:
            return None  # nothing to remove: no commit
        if isinstance(intent, MoveRef | RemoveRef | Expire):
            self._commit_updates(*ref_change(intent, self._table))
            return None
        # the catalog loads, deep-copies and writes the whole metadata
        with nogc.paused(), refused_as_conflict():
            # an append reads only the head: cut the metadata to it (a delete or a rewrite reads files)
            appends = isinstance(intent, Append | Reapply)
            transaction = self._transaction(head_only(self._table.metadata, self.branch) if appends else None)
            added = files_added(intent, self._table)
            self._same_spec(added, transaction)
            snapshot_id = stage(transaction, intent, self._table, self.branch, added)
            self.commit_transaction(transaction)
        if snapshot_id is None:
            snapshot_id = self.branch_head(self.branch)
            assert snapshot_id is not None, "a committed snapshot is the branch head"
        return snapshot_id

    def _same_spec(self, files: Sequence[WrittenFile], transaction: Transaction) -> None:
        """Refuse to commit files written under a partition spec the table no longer has as its
        default (``ingest evolve-partitioning`` or another tool evolved it meanwhile): pyiceberg
        writes a commit's added files into one manifest of the default spec, which would mislabel
        their partitions. Nothing is committed; the next run writes the records under the new spec."""
        if files and self._files_spec is not None and self._files_spec != transaction.table_metadata.default_spec_id:
            raise SchemaMoved(
                f"{self.identifier}: the table's partition spec changed while this batch's files were written "
                "under the one before; nothing was committed, and the next run writes them under the new spec"
            )

    def commit_transaction(self, transaction: Transaction) -> None:
        """Commit ``transaction`` (built on :func:`~ingest.iceberg.commits.without_library_retries`)
        with the catalog's own requirements; map the outcome to conflict or unknown."""
        try:
            self._table = transaction.commit_transaction()
            self._loaded_at = -math.inf
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from None
        except Exception as error:
            raise CommitUnknown(f"{type(error).__name__}: {error}") from None

    def _commit_updates(self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...]) -> None:
        """Commit metadata updates (no new snapshot) under exactly ``requirements`` and the table's
        UUID, straight through the catalog: nothing in between may retry or rebase them.

        A requirement that fails, or an update the catalog's current metadata cannot take (a
        snapshot already removed), did not apply: :class:`CommitConflict`. Anything else leaves
        the outcome open: :class:`CommitUnknown`.
        """
        table = self._table
        requirements = (*requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
        try:
            with nogc.paused():
                response = self.catalog.commit_table(table, requirements, updates)
        except (CommitFailedException, ValueError) as error:
            raise CommitConflict(str(error)) from None
        except Exception as error:
            raise CommitUnknown(f"{type(error).__name__}: {error}") from None
        self._table = Table(
            table.name(), response.metadata, response.metadata_location, table.io, table.catalog, table.config
        )
        self._loaded_at = -math.inf

    def dead_letter_coordinates(self, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]]) -> pa.Table:
        """The coordinates (topic, partition, offset) of the dead letters in ``spans`` on the branch head."""
        return self.coordinates_in(records.DEAD_LETTERS, spans, self.branch_head(self.branch))

    def coordinates_in(
        self,
        columns: records.Coordinates,
        spans: Mapping[TopicPartition, Sequence[tuple[int, int]]],
        snapshot_id: int | None,
    ) -> pa.Table:
        """The coordinates (topic, partition, offset, named as ``columns`` says) of the records in
        ``spans`` (``[start, end)`` offset ranges per partition) at ``snapshot_id``: files whose
        column statistics rule the spans out are not read."""
        names = [columns.topic, columns.partition, columns.offset]
        if snapshot_id is None or not spans:
            return self._table.schema().as_arrow().empty_table().select(names)
        return self._table.scan(
            row_filter=in_spans(spans, columns), snapshot_id=snapshot_id, selected_fields=tuple(names)
        ).to_arrow()

    def scan_columns(self, columns: Sequence[str], snapshot_id: int | None = None) -> pa.Table:
        if snapshot_id is None:
            snapshot_id = self.branch_head(self.branch)
            if snapshot_id is None:
                return self._table.schema().as_arrow().empty_table().select(list(columns))
        return self._table.scan(selected_fields=tuple(columns), snapshot_id=snapshot_id).to_arrow()


def snapshot_view(snapshot: Snapshot) -> SnapshotView:
    summary = snapshot.summary
    return SnapshotView(
        snapshot.snapshot_id,
        dict(summary.additional_properties) if summary is not None else {},
        snapshot.timestamp_ms,
        str(summary.operation.value) if summary is not None else None,
    )
