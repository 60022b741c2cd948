"""A table in the catalog as a pipeline lays it out: opened, or created with the config's schema,
partition spec, properties and sort order (and its namespace), checked against them
(:func:`misfit`), its partitioning evolved (:func:`evolve_spec`); looked up, listed and
read for its fields without being created."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortOrder

from ingest import nogc, records
from ingest.errors import CatalogUnavailable, ConfigError, TableMismatch
from ingest.iceberg.commits import without_library_retries
from ingest.iceberg.schema import (
    declared_fields,
    described_spec,
    partition_spec,
    sort_difference,
    sort_order,
    spec_difference,
    stage_spec,
)
from ingest.iceberg.table import NO_LIBRARY_RETRIES, IcebergTable
from ingest.records import Field, SortKey


def open_table(
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
    saying so: :func:`misfit`), as is one whose schema cannot evolve to take ``schema``."""
    handle = load_or_create(catalog, identifier, schema, spec, renames, properties, sort_by)
    why = misfit(handle, schema, spec, properties, sort_by)
    if why is not None:
        raise TableMismatch(why)
    handle.take_schema(schema)
    return handle


def load_or_create(
    catalog: Catalog,
    identifier: str,
    schema: Schema,
    spec: PartitionSpec | None = None,
    renames: Mapping[str, str] | None = None,
    properties: Mapping[str, str] | None = None,
    sort_by: Sequence[SortKey] = (),
) -> IcebergTable:
    """The table as it is, created (with its namespace) if missing, for :func:`open_table`'s arguments;
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
    return IcebergTable(catalog, identifier, table, loaded_at=time.monotonic(), renames=renames)


def misfit(
    handle: IcebergTable,
    schema: Schema,
    spec: PartitionSpec | None,
    properties: Mapping[str, str] | None,
    sort_by: Sequence[SortKey],
) -> str | None:
    """Why the table as the handle holds it cannot take rows of ``schema`` laid out so (None: it
    can): its partitioning is not ``spec`` (of ``schema``'s columns, when given), its value of one
    of ``properties`` differs, or its sort order is not ``sort_by`` (when given). Whether its
    schema can evolve to take the rows is :meth:`IcebergTable.evolve_to`'s to say."""
    table, identifier, renames = handle.table, handle.identifier, handle.renames
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


def existing(catalog: Catalog, identifier: str) -> IcebergTable | None:
    """The table if it exists (loaded as it is, nothing created or changed), else None."""
    try:
        return IcebergTable(catalog, identifier, catalog.load_table(identifier), loaded_at=time.monotonic())
    except NoSuchTableError:
        return None
    except Exception as error:
        raise CatalogUnavailable(f"cannot load table {identifier}: {error}") from None


def names_in(catalog: Catalog, namespace: str) -> list[str]:
    """The tables of ``namespace`` (none if it does not exist), as ``namespace.table``."""
    try:
        return sorted(".".join(ident) for ident in catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []
    except Exception as error:
        raise CatalogUnavailable(f"cannot list the tables of namespace {namespace}: {error}") from None


def exists(catalog: Catalog, identifier: str) -> bool:
    try:
        return bool(catalog.table_exists(identifier))
    except Exception as error:
        raise CatalogUnavailable(f"cannot look up table {identifier}: {error}") from None


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


def evolve_spec(
    handle: IcebergTable, partition_by: Sequence[str], *, dry_run: bool = False
) -> tuple[list[str], list[str]]:
    """Evolve the table's partition spec to ``partition_by`` (of columns the table has), in one
    metadata commit that requires the table's current spec; with ``dry_run``, only say how.
    Returns the spec before and after as ``transform(column)`` items (the same if the table
    has it already: nothing is committed). New data files follow the new spec; files written
    before keep theirs (Iceberg plans scans over both)."""
    handle.refresh()
    schema, spec = handle.table.schema(), handle.table.spec()
    for item in partition_by:
        transform = records.parse_transform(item)
        if transform is not None and transform.column not in schema.column_names:
            raise ConfigError(
                f"partition_by: {item!r} refers to {transform.column!r}, which {handle.identifier} does not have "
                "yet: run a batch first (it adds the column), then evolve the partitioning"
            )
    before, wanted = described_spec(schema, spec), partition_spec(schema, partition_by)
    if spec_difference(schema, spec, schema, wanted) is None or dry_run:
        return before, described_spec(schema, wanted)
    with nogc.paused():
        transaction = without_library_retries(handle.table).transaction()
        try:
            stage_spec(transaction, schema, spec, wanted)
        except ValueError as error:  # what pyiceberg's spec update refuses (a name taken, say)
            raise ConfigError(f"partition_by: {handle.identifier} cannot take it: {error}") from None
        handle.commit_transaction(transaction)
    return before, described_spec(handle.table.schema(), handle.table.spec())


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
