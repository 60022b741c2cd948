"""The one place a pipeline meets its adapters: a config becomes an Iceberg catalog and tables, a
Kafka source and a Schema Registry client, and the batch loop (:class:`ingest.pipeline.Pipeline`,
which speaks only ports) over them.

:func:`layout` says what a pipeline is before any table is touched (``ingest check`` stops there);
:func:`open_pipeline` opens it, creating its tables if missing; :func:`open_existing` opens it only
if its rows table exists (the read-only commands). Operations read the tables it opened as the
Iceberg tables they are (:data:`Opened`, :func:`routed_tables`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ingest.config import ROUTE_VALUE, ROUTE_VALUE_CHARS, PipelineConfig
from ingest.core.ledger_codec import registered_pipelines
from ingest.fields import from_schema_file, from_subjects, key_field_of, values_in_registry
from ingest.format_names import REGISTRY_FORMATS
from ingest.iceberg.catalog import absent, connect
from ingest.iceberg.layout import existing, exists, fields_of, load_or_create, misfit, names_in, open_table
from ingest.iceberg.schema import dead_letter_schema, partition_spec, rows_schema, sort_order
from ingest.iceberg.table import Catalog, IcebergTable, PartitionSpec, Schema
from ingest.kafka.source import KafkaSource
from ingest.pipeline import Pipeline
from ingest.ports import RoutedTable, SchemaRegistry
from ingest.records import (
    EXTRA_COLUMN,
    HEADERS_COLUMN,
    HEADERS_TYPE,
    KEY_COLUMN,
    Declared,
    Field,
    SortKey,
    parse_sort,
    renamed,
)
from ingest.route_by.tables import Routes

#: a pipeline as this module opens it: on Iceberg tables and a Kafka source
Opened = Pipeline[IcebergTable, KafkaSource]


@dataclass(frozen=True)
class Layout:
    """What a pipeline is before any table is touched: its clients, and the rows table's fields,
    schema and partition spec as the config, the registry and an existing table make them."""

    source: KafkaSource
    registry: SchemaRegistry | None
    #: None: not opened (``catalog_absent``)
    catalog: Catalog | None
    fields: list[Declared]
    schema: Schema
    spec: PartitionSpec
    sort_by: list[SortKey]


def layout(config: PipelineConfig, *, catalog_absent: bool = False) -> Layout:
    """The layout of ``config``'s pipeline, checked as far as it can be without writing anything:
    librdkafka's properties, the catalog, the registry subjects, the partition transforms against
    the columns' types. Raises what a run would, before its first side effect. With
    ``catalog_absent`` (a SQLite catalog whose file does not exist yet) the catalog is not opened:
    it holds no table."""
    # librdkafka checks its properties now: a misspelt one stops the run before any side effect
    source = KafkaSource(config.kafka, config.subscription, config.group_id, config.batch.read_timeout_s)
    registry = None
    if values_in_registry(config) or config.key_format in REGISTRY_FORMATS:
        from ingest.kafka.registry import Registry  # the registry client costs ~130 ms to import

        registry = Registry(config.schema_registry or {})
    catalog = None if catalog_absent else connect(config.catalog, config.commit.request_timeout_s)
    # without `schema:`, the table's own fields (evolved per batch), or the subject's to create it
    from_file = from_schema_file(config)  # checked against `schema:` too
    fields: list[Declared] = list(config.schema_ or from_file or [])
    if not fields and catalog is not None:
        own = fields_of(catalog, config.table) or []
        fields = list(renamed([f for f in own if f.name != KEY_COLUMN], config.renames))
    fields = fields or list(from_subjects(config, registry))
    if config.key_format is not None:  # the key column as the table has it, or as the keys are
        had = fields_of(catalog, config.table, only=[KEY_COLUMN]) if catalog is not None else None
        fields = [*fields, *(had or [key_field_of(config, registry)])]
    if config.headers and all(f.name != HEADERS_COLUMN for f in fields):
        fields = [
            *fields,
            Field(HEADERS_COLUMN, HEADERS_TYPE, False, "the record's Kafka headers: each key's last value"),
        ]
    if config.unknown_fields == "capture" and all(f.name != EXTRA_COLUMN for f in fields):
        fields = [
            *fields,
            Field(EXTRA_COLUMN, "string", False, "fields the records had that the table does not declare"),
        ]
    schema = rows_schema(fields)
    sort_by = [key for item in config.sort_by if (key := parse_sort(item)) is not None]
    sort_order(schema, sort_by)  # its columns are the table's
    return Layout(source, registry, catalog, fields, schema, partition_spec(schema, config.partition_by), sort_by)


@dataclass(frozen=True)
class IcebergTableMaker:
    """``route_by``'s tables in an Iceberg catalog (a :class:`~ingest.ports.TableMaker`): created
    with the config's partitioning, properties and sort order, renames applied with the first commit."""

    catalog: Catalog
    config: PipelineConfig
    sort_by: Sequence[SortKey]

    def open(self, name: str, fields: Sequence[Declared]) -> IcebergTable:
        schema = rows_schema(fields)
        return load_or_create(
            self.catalog,
            name,
            schema,
            partition_spec(schema, self.config.partition_by),
            self.config.renames,
            properties=self.config.table_properties,
            sort_by=self.sort_by,
        )

    def misfit(self, table: RoutedTable, fields: Sequence[Declared]) -> str | None:
        assert isinstance(table, IcebergTable), table
        schema = rows_schema(fields)
        spec = partition_spec(schema, self.config.partition_by)
        return misfit(table, schema, spec, self.config.table_properties, self.sort_by)


def routes(config: PipelineConfig, planned: Layout) -> Routes:
    """The tables ``route_by`` routes ``config``'s records to that there are: those of
    ``route_by.table``'s namespace whose names it makes and that this pipeline has committed to
    (whatever ``allow`` says now: ``verify`` counts their rows). Another table the template names
    is opened when records first name it."""
    assert config.route_by is not None and planned.catalog is not None
    prefix, _, suffix = config.route_by.table.partition(ROUTE_VALUE)
    routed = Routes(config, IcebergTableMaker(planned.catalog, config, planned.sort_by), {})
    names = []
    for name in names_in(planned.catalog, config.route_by.namespace):
        value = name[len(prefix) : len(name) - len(suffix)]
        if not (name.startswith(prefix) and name.endswith(suffix) and ROUTE_VALUE_CHARS.fullmatch(value)):
            continue
        table = existing(planned.catalog, name)
        if table is not None and config.pipeline in registered_pipelines(table.head().properties):
            names.append(name)
    routed.create(names, planned.fields)
    return routed


def open_pipeline(config: PipelineConfig) -> Opened:
    """The pipeline of ``config``: its tables opened, created if missing (see :func:`layout`)."""
    planned = layout(config)
    catalog = planned.catalog
    assert catalog is not None
    dead = open_table(catalog, config.dead_letters, dead_letter_schema())

    def sibling(name: str) -> IcebergTable | None:
        return existing(catalog, name)

    if config.route_by is not None:
        ledger = open_table(catalog, config.table, rows_schema([]))  # the ledger's: no rows
        routed = routes(config, planned)
        return Pipeline(config, planned.source, ledger, dead, planned.fields, planned.registry, routed, sibling)
    rows = open_table(
        catalog,
        config.table,
        planned.schema,
        planned.spec,
        config.renames,
        properties=config.table_properties,
        sort_by=planned.sort_by,
    )
    return Pipeline(config, planned.source, rows, dead, planned.fields, planned.registry, siblings=sibling)


def open_existing(config: PipelineConfig) -> Opened | None:
    """The pipeline if its rows table exists, else None, creating nothing: what the read-only
    commands (``status``, ``history``, ``verify``) open."""
    if absent(config.catalog) is not None:  # opening the catalog would create its file
        return None
    if not exists(connect(config.catalog, config.commit.request_timeout_s), config.table):
        return None
    return open_pipeline(config)  # the dead-letter table too: missing (renamed in the config?), it is created empty


def routed_tables(pipeline: Opened) -> dict[str, IcebergTable]:
    """With ``route_by``: the routed tables there are, by name, as operations read and maintain them."""
    tables = dict(pipeline.routes.handles) if pipeline.routes is not None else {}
    assert all(isinstance(t, IcebergTable) for t in tables.values()), tables  # IcebergTableMaker made each
    return {name: table for name, table in tables.items() if isinstance(table, IcebergTable)}
