"""pyiceberg's SQL catalog, parsing each table metadata file once (see :class:`HeldSqlCatalog`).

Imported by :func:`ingest.iceberg.catalog.connect` when it opens an SQL catalog, and only then: SQLAlchemy
adds half a second to the imports of every process that loads it.
"""

from __future__ import annotations

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate


class HeldSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, keeping the metadata it last parsed or committed for each table.

    pyiceberg parses a table's whole metadata file on every load: twice per batch (planning
    refreshes the head, and the commit checks it again), ~25 ms each at 1,000 snapshots. An Iceberg
    metadata file is never changed once written and every commit writes one under a new name, so
    when a load finds the same ``metadata_location`` in the table's row as last time, the
    metadata parsed then is still exact. The row is read on every load, so a commit by any other
    writer is seen at once; only the parsing is saved.
    """

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        #: per table: the metadata location last loaded or committed, and its parsed metadata
        self._held: dict[tuple[str, ...], tuple[str, TableMetadata]] = {}

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        identifier = (*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name)
        location = orm_table.metadata_location
        held = self._held.get(identifier)
        if held is None or held[0] != location:
            table = super()._convert_orm_to_iceberg(orm_table)
            self._held[identifier] = (table.metadata_location, table.metadata)
            return table
        metadata = held[1]
        return Table(identifier, metadata, location, self._load_file_io(metadata.properties, location), self)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        self._held[table.name()] = (response.metadata_location, response.metadata)
        return response
