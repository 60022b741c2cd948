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
``0`` (:func:`_no_library_retry`), whatever the table's own properties say.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import overload

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog as Catalog  # re-exported: a pipeline's layout names these
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import In
from pyiceberg.io.pyarrow import (
    _dataframe_to_data_files,
    parquet_file_to_data_file,
)
from pyiceberg.manifest import DataFile as DataFile  # re-exported: engines pass these around
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.partitioning import PartitionSpec as PartitionSpec
from pyiceberg.schema import Schema as Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.update import AssertTableUUID, TableRequirement, TableUpdate

from ingest import nogc, records
from ingest.config import PIPELINE_TABLE_PROPERTIES
from ingest.core.expiry import MAIN as MAIN  # re-exported: the branch every run commits to
from ingest.core.expiry import Ref
from ingest.core.ledger import SnapshotView, TopicPartition
from ingest.errors import (
    BranchGone,
    CatalogUnavailable,
    CommitConflict,
    CommitUnknown,
    ConfigError,
    SchemaMoved,
    TableMismatch,
    WrittenFilesGone,
)
from ingest.iceberg.commits import files_added, in_spans, is_, ref_change, stage
from ingest.iceberg.schema import (
    declared_fields,
    describe_change,
    described_spec,
    partition_spec,
    rows_schema,
    sort_difference,
    sort_keys,
    sort_order,
    spec_difference,
    stage_evolution,
    stage_spec,
)
from ingest.intents import Append, Expire, MoveRef, Reapply, RefIntent, RemoveRef, SnapshotIntent
from ingest.intents import DataFile as WrittenFile
from ingest.ports import Head
from ingest.records import Declared, Field, SortKey

log = logging.getLogger(__name__)

NO_LIBRARY_RETRIES = PIPELINE_TABLE_PROPERTIES
#: the catalog properties a file IO needs to write data files (what crosses to workers and executors)
STORAGE_PROPERTIES = ("s3.", "gcs.", "adls.", "hdfs.", "hf.", "oss.", "client.", "pyarrow.", "py-io-impl")


def _no_library_retry(table: Table, metadata: TableMetadata | None = None) -> Table:
    """``table`` (over ``metadata``, default its own) as a base for one commit that pyiceberg
    must not retry: pyiceberg reads the retry count from the base metadata's properties when the
    commit is made. The override is never written: the catalog applies only the commit's updates
    to its own current metadata."""
    metadata = metadata if metadata is not None else table.metadata
    exact = metadata.model_copy(update={"properties": {**metadata.properties, **NO_LIBRARY_RETRIES}})
    return Table(table.name(), exact, table.metadata_location, table.io, table.catalog, table.config)


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
        #: the schema records are written in, when the table's must evolve to take it: every commit
        #: through this handle carries that evolution (see :meth:`evolve_to`)
        self._wanted: Schema | None = None
        #: the schema data files were last written with while evolving (held metadata, evolved)
        self._written_with: Schema | None = None
        #: the held metadata the evolved one for writes was derived from, and that evolved metadata
        self._for_writes: tuple[TableMetadata, TableMetadata] | None = None
        #: top-level columns the evolution renames first, old name → new (``renames:``)
        self._renames: dict[str, str] = {}
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
        self._evolve_to(rows_schema(fields))

    def _evolve_to(self, schema: Schema) -> None:
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
        transaction = _no_library_retry(self._table, metadata).transaction()
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

    @classmethod
    def open(
        cls,
        catalog: Catalog,
        identifier: str,
        schema: Schema,
        spec: PartitionSpec | None = None,
        renames: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        sort_by: Sequence[SortKey] = (),
    ) -> IcebergTable:
        """Load the table, creating it (and its namespace) if missing; its columns renamed by
        ``renames`` (old → new) with the next commit, before it takes ``schema``. An existing table
        whose partitioning differs from ``spec`` (when given), whose value of one of ``properties``
        differs, or whose sort order is not ``sort_by`` (when given) is refused (:class:`TableMismatch`,
        saying so: :meth:`misfit`), as is one whose schema cannot evolve to take ``schema``."""
        handle = cls.load_or_create(catalog, identifier, schema, spec, renames, properties, sort_by)
        why = handle.misfit(schema, spec, properties, sort_by)
        if why is not None:
            raise TableMismatch(why)
        handle._evolve_to(schema)
        return handle

    @classmethod
    def load_or_create(
        cls,
        catalog: Catalog,
        identifier: str,
        schema: Schema,
        spec: PartitionSpec | None = None,
        renames: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        sort_by: Sequence[SortKey] = (),
    ) -> IcebergTable:
        """The table as it is, created (with its namespace) if missing, for :meth:`open`'s arguments;
        nothing about it checked.

        A table this creates gets ``properties``, the sort order ``sort_by`` and
        ``commit.retry.num-retries=0``, which tells other tools that library retries are unsafe
        here; an existing table is not changed (every commit made here forces the retries off itself)."""
        try:
            table = _load_or_create(
                catalog,
                identifier,
                schema,
                spec or UNPARTITIONED_PARTITION_SPEC,
                {**(properties or {}), **NO_LIBRARY_RETRIES},
                sort_order(schema, sort_by),
            )
        except (ConfigError, TableMismatch):
            raise
        except Exception as error:
            raise CatalogUnavailable(f"cannot load or create table {identifier}: {error}") from None
        handle = cls(catalog, identifier, table, loaded_at=time.monotonic())
        handle._renames = dict(renames or {})
        return handle

    def misfit(
        self,
        schema: Schema,
        spec: PartitionSpec | None,
        properties: Mapping[str, str] | None,
        sort_by: Sequence[SortKey],
    ) -> str | None:
        """Why the table as the handle holds it cannot take rows of ``schema`` laid out so (None: it
        can): its partitioning is not ``spec`` (of ``schema``'s columns, when given), its value of one
        of ``properties`` differs, or its sort order is not ``sort_by`` (when given). Whether its
        schema can evolve to take the rows is :meth:`evolve_to`'s to say."""
        table, identifier, renames = self._table, self.identifier, self._renames
        difference = None
        if spec is not None:
            difference = spec_difference(table.schema(), table.spec(), schema, spec, renames)
        if difference is not None:
            return (
                f"table {identifier}: {difference}. A table's partitioning does not change with the config: "
                "set `partition_by:` to the table's, or evolve the table's spec to the config's (`ingest "
                "evolve-partitioning -c CONFIG`, not yet with `route_by`; or your engine's ALTER TABLE ... ADD/DROP "
                "PARTITION FIELD); new data then follows it, files written before keep theirs."
            )
        had = {**table.properties, "format-version": str(table.format_version)}  # pyiceberg keeps it apart
        differ = {k: v for k, v in (properties or {}).items() if had.get(k) != v}
        if differ:
            found = ", ".join(f"{k} = {had.get(k)!r} (config: {v!r})" for k, v in sorted(differ.items()))
            wanted = ", ".join(f"'{k}'='{v}'" for k, v in sorted(differ.items()))
            return (
                f"table {identifier}: its properties differ from `table_properties:`: {found}. Set them in the "
                f"config as the table has them, or change the table (Spark: ALTER TABLE {identifier} SET "
                f"TBLPROPERTIES ({wanted}))."
            )
        unsorted = sort_difference(table.schema(), table.sort_order(), sort_by, renames) if sort_by else None
        if unsorted is not None:
            return (
                f"table {identifier}: {unsorted}. Set `sort_by:` as the table's, or change the table's sort "
                f"order with your engine (Spark: ALTER TABLE {identifier} WRITE ORDERED BY ...)."
            )
        return None

    def evolve_partitioning(self, partition_by: Sequence[str], *, dry_run: bool = False) -> tuple[list[str], list[str]]:
        """Evolve the table's partition spec to ``partition_by`` (of columns the table has), in one
        metadata commit that requires the table's current spec; with ``dry_run``, only say how.
        Returns the spec before and after as ``transform(column)`` items (the same if the table
        has it already: nothing is committed). New data files follow the new spec; files written
        before keep theirs (Iceberg plans scans over both)."""
        self.refresh()
        schema, spec = self._table.schema(), self._table.spec()
        for item in partition_by:
            transform = records.parse_transform(item)
            if transform is not None and transform.column not in schema.column_names:
                raise ConfigError(
                    f"partition_by: {item!r} refers to {transform.column!r}, which {self.identifier} does not have "
                    "yet: run a batch first (it adds the column), then evolve the partitioning"
                )
        before, wanted = described_spec(schema, spec), partition_spec(schema, partition_by)
        if spec_difference(schema, spec, schema, wanted) is None or dry_run:
            return before, described_spec(schema, wanted)
        with nogc.paused():
            transaction = _no_library_retry(self._table, None).transaction()
            try:
                stage_spec(transaction, schema, spec, wanted)
            except ValueError as error:  # what pyiceberg's spec update refuses (a name taken, say)
                raise ConfigError(f"partition_by: {self.identifier} cannot take it: {error}") from None
            self._commit(transaction)
        return before, described_spec(self._table.schema(), self._table.spec())

    @classmethod
    def existing(cls, catalog: Catalog, identifier: str) -> IcebergTable | None:
        """The table if it exists (loaded as it is, nothing created or changed), else None."""
        try:
            return cls(catalog, identifier, catalog.load_table(identifier), loaded_at=time.monotonic())
        except NoSuchTableError:
            return None
        except Exception as error:
            raise CatalogUnavailable(f"cannot load table {identifier}: {error}") from None

    @staticmethod
    def names_in(catalog: Catalog, namespace: str) -> list[str]:
        """The tables of ``namespace`` (none if it does not exist), as ``namespace.table``."""
        try:
            return sorted(".".join(ident) for ident in catalog.list_tables(namespace))
        except NoSuchNamespaceError:
            return []
        except Exception as error:
            raise CatalogUnavailable(f"cannot list the tables of namespace {namespace}: {error}") from None

    @staticmethod
    def exists(catalog: Catalog, identifier: str) -> bool:
        try:
            return bool(catalog.table_exists(identifier))
        except Exception as error:
            raise CatalogUnavailable(f"cannot look up table {identifier}: {error}") from None

    @staticmethod
    def fields_of(catalog: Catalog, identifier: str, only: Collection[str] | None = None) -> list[Field] | None:
        """The declared fields of the rows table ``identifier`` (with ``only``, just those named so);
        None if there is no such table."""
        try:
            return declared_fields(catalog.load_table(identifier).schema(), only)
        except NoSuchTableError:
            return None
        except TableMismatch:
            raise
        except Exception as error:
            raise CatalogUnavailable(f"cannot load table {identifier}: {error}") from None

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
            yield _view(snapshot)
            snapshot_id = snapshot.parent_snapshot_id

    def all_snapshots(self) -> list[SnapshotView]:
        return [_view(s) for s in self._table.metadata.snapshots]

    def refs(self) -> list[Ref]:
        """Every branch and tag, as the handle last read them."""
        return [
            Ref(name, ref.snapshot_id, ref.snapshot_ref_type == SnapshotRefType.BRANCH)
            for name, ref in sorted(self._table.metadata.refs.items())
        ]

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[WrittenFile]:
        """Parquet files under unique names in the table location; invisible until committed."""
        if data.num_rows == 0:
            return []
        metadata = self._metadata_for_writes()
        self._files_spec = metadata.default_spec_id
        keys = sort_keys(metadata.schema(), metadata.sort_order())
        if keys:  # each file sorted as the table's sort order says (ours, or one another tool set)
            data = _sorted(data, keys)
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

    def read_written(self, paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """``columns`` of data files :meth:`write` wrote and no snapshot references yet."""
        files = self.adopt(paths)
        arrow = self._table.schema().as_arrow()
        schema = pa.schema([arrow.field(c) for c in columns])
        tables = [schema.empty_table()]
        for data_file in files:
            with self._table.io.new_input(data_file.file_path).open() as stream:
                tables.append(pq.read_table(stream, columns=list(columns)).cast(schema))
        return pa.concat_tables(tables)

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
        if isinstance(intent, MoveRef | RemoveRef | Expire):
            if not (isinstance(intent, Expire) and not intent.snapshot_ids):
                self._commit_updates(*ref_change(intent, self._table))
            return None
        # the catalog loads, deep-copies and writes the whole metadata
        with nogc.paused(), _refused_as_conflict():
            # an append reads only the head: cut the metadata to it (a delete or a rewrite reads files)
            appends = isinstance(intent, Append | Reapply)
            transaction = self._transaction(self._head_only() if appends else None)
            added = files_added(intent, self._table)
            self._same_spec(added, transaction)
            snapshot_id = stage(transaction, intent, self._table, self.branch, added)
            self._commit(transaction)
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

    def _head_only(self) -> TableMetadata:
        """This table's metadata cut to the branch head: what an append to that head needs.

        pyiceberg's ``Transaction`` re-derives, and deep-copies, the whole table metadata each time
        it reads it (about fifteen times per append), so an append's cost grew with the number of
        snapshots (~1 s at 1,000). An append reads only the head snapshot (its manifest list and
        summary totals), the schema, spec and properties; the catalog applies the resulting
        updates to its own, complete metadata under the same head requirement, so the committed
        table is the same. The handle returned by the commit holds the catalog's full metadata.
        """
        metadata = self._table.metadata
        head = self.branch_head(self.branch)
        return metadata.model_copy(
            update={
                "snapshots": [s for s in metadata.snapshots if s.snapshot_id == head],
                "refs": {self.branch: metadata.refs[self.branch]} if head is not None else {},
                "snapshot_log": [],
                "metadata_log": [],
            }
        )

    def _commit(self, transaction: Transaction) -> None:
        """Commit with the catalog's own requirements; map the outcome to conflict or unknown."""
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

    def dead_letters_of(self, topics: Collection[str], columns: Sequence[str] | None = None) -> pa.Table:
        """The dead letters of ``topics`` on the branch head (``columns`` of the dead-letter table; all by default)."""
        head = self.branch_head(self.branch)
        if head is None or not topics:
            empty = self._table.schema().as_arrow().empty_table()
            return empty.select(list(columns)) if columns else empty
        return self._table.scan(
            row_filter=is_(In, records.DEAD_LETTERS.topic, set(topics)),
            snapshot_id=head,
            selected_fields=tuple(columns) if columns else ("*",),
        ).to_arrow()

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


@contextlib.contextmanager
def _refused_as_conflict() -> Iterator[None]:
    """A requirement pyiceberg checks against the held metadata while it builds a commit (the
    branch's head, its existence) fails as the catalog's would: a conflict, to be observed again."""
    try:
        yield
    except CommitFailedException as error:
        raise CommitConflict(str(error)) from None


def _view(snapshot: Snapshot) -> SnapshotView:
    summary = snapshot.summary
    return SnapshotView(
        snapshot.snapshot_id,
        dict(summary.additional_properties) if summary is not None else {},
        snapshot.timestamp_ms,
        str(summary.operation.value) if summary is not None else None,
    )


def _sorted(data: pa.Table, keys: Sequence[SortKey]) -> pa.Table:
    """``data`` in the order of ``keys`` (the columns it has): ascending with nulls first,
    descending with nulls last, as Iceberg's sort orders default."""
    order = [
        (k.column, "descending", "at_end") if k.descending else (k.column, "ascending", "at_start")
        for k in keys
        if k.column in data.column_names
    ]
    return data.take(pc.sort_indices(data, sort_keys=order)) if order else data


def _load_or_create(
    catalog: Catalog,
    identifier: str,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str],
    order: SortOrder,
) -> Table:
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
        return catalog.create_table(
            identifier, schema=schema, partition_spec=spec, sort_order=order, properties=dict(properties)
        )
    except TableAlreadyExistsError:  # a concurrent copy of the pipeline created it first
        return catalog.load_table(identifier)
