"""What a pipeline's rows table is before any table is touched: its clients, and its fields,
schema, partition spec and sort order as the config, the registry subjects and an existing table
make them (:func:`layout`); and how those fields evolve to take new writer schemas
(:func:`evolved`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ingest import formats
from ingest.config import (
    REGISTRY_FORMATS,
    ROUTE_VALUE,
    ROUTE_VALUE_CHARS,
    PipelineConfig,
    TopicSource,
    schema_file_text,
)
from ingest.core.ledger_codec import registered_pipelines
from ingest.errors import ConfigError, SchemaChangeRefused, SubjectNotFound
from ingest.formats import keys
from ingest.iceberg.catalog import connect
from ingest.iceberg.schema import partition_spec, rows_schema, sort_order
from ingest.iceberg.table import Catalog, IcebergTable, PartitionSpec, Schema
from ingest.kafka.source import KafkaSource
from ingest.ports import RoutedTable, SchemaRegistry, WriterSchema
from ingest.records import (
    EXTRA_COLUMN,
    HEADERS_COLUMN,
    HEADERS_TYPE,
    KEY_COLUMN,
    Declared,
    Field,
    Merged,
    SortKey,
    merge,
    parse_sort,
    parse_transform,
    renamed,
)
from ingest.route_by.tables import Routes


def _from_file(config: PipelineConfig) -> list[Field] | None:
    """The fields of the Avro schema file of plain Avro topics (``schema_file:``), if any; with
    ``schema:`` declared too, the file's records must fit it."""
    if config.schema_file is None:
        return None
    text = schema_file_text(config.schema_file)
    try:
        own = renamed(formats.fields_of(WriterSchema(0, "AVRO", text)), config.renames)
    except ValueError as error:
        raise ConfigError(f"schema_file {config.schema_file} cannot be a table's schema: {error}") from None
    if config.schema_:
        problems = merge(config.schema_, own).problems
        if problems:
            raise ConfigError(f"schema_file {config.schema_file} does not fit `schema:`: {'; '.join(problems)}")
        return None
    return own


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
    from_file = _from_file(config)  # checked against `schema:` too
    fields: list[Declared] = list(config.schema_ or from_file or [])
    if not fields and catalog is not None:
        own = IcebergTable.fields_of(catalog, config.table) or []
        fields = list(renamed([f for f in own if f.name != KEY_COLUMN], config.renames))
    fields = fields or list(_from_subjects(config, registry))
    if config.key_format is not None:  # the key column as the table has it, or as the keys are
        had = IcebergTable.fields_of(catalog, config.table, only=[KEY_COLUMN]) if catalog is not None else None
        fields = [*fields, *(had or [_key_from(config, registry)])]
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


def values_in_registry(config: PipelineConfig) -> bool:
    return config.format in REGISTRY_FORMATS and config.schema_file is None


def _key_from(config: PipelineConfig, registry: SchemaRegistry | None) -> Field:
    """The key column of a table that has none yet: a string, or the latest schemas of the topics'
    key subjects, merged."""
    if config.key_format == "string":
        return Field(KEY_COLUMN, "string", False)
    assert registry is not None  # config requires a registry then
    fix = "Fix the subject, set `key_subject:`, or leave `key_format:` out to keep keys raw."
    merged = _merged_subjects(config, lambda t: latest_key(registry, t), lambda w: [keys.key_field(w)], "key", fix)
    return merged[0]


def _merged_subjects(
    config: PipelineConfig,
    latest: Callable[[TopicSource], WriterSchema],
    own: Callable[[WriterSchema], list[Field]],
    part: Literal["value", "key"],
    fix: str,
) -> list[Field]:
    """The fields of the topics' latest ``part`` schemas (``latest``, mapped by ``own``), merged in
    the order of ``topics:``; a schema that maps to none, or subjects that disagree, are config errors."""
    fields: list[Field] = []
    for topic in config.sources:
        writer = latest(topic)
        subject = topic.key_subject_name if part == "key" else topic.value_subject
        try:
            mine = own(writer)
            merged = merge(fields, mine) if fields else Merged(tuple(mine), ())
        except ValueError as error:
            what = "a key column" if part == "key" else "a table's schema"
            raise ConfigError(
                f"the latest schema of subject {subject!r} (id {writer.schema_id}) cannot be {what}: {error}. {fix}"
            ) from None
        if merged.problems:
            kind = "key subjects" if part == "key" else "subjects"
            raise ConfigError(f"the {kind} of `topics:` disagree: {'; '.join(merged.problems)}")
        fields = list(merged.fields)
    return fields


def latest_key(registry: SchemaRegistry, topic: TopicSource) -> WriterSchema:
    try:
        return registry.latest(topic.key_subject_name)
    except SubjectNotFound:
        raise SubjectNotFound(
            f"the Schema Registry has no subject {topic.key_subject_name!r}, which the key column of topic "
            f"{topic.name!r} is derived from (key_format: {topic.key_format}). Register the key schema first (a "
            "producer's serializer does on its first record), set `key_subject:` on the topic, or leave "
            "`key_format:` out to keep keys raw."
        ) from None


def _from_subjects(config: PipelineConfig, registry: SchemaRegistry | None) -> list[Field]:
    """The rows table's fields when ``schema:`` is omitted: the latest schemas of the topics'
    subjects, merged (in the order of ``topics:``)."""
    assert registry is not None  # config requires a registry format then
    fields = _merged_subjects(
        config,
        lambda t: registry.latest(t.value_subject),
        lambda w: renamed(formats.fields_of(w), config.renames),
        "value",
        "Declare `schema:` for the fields you want, or fix the subject.",
    )
    names = {f.name for f in fields} | ({KEY_COLUMN} if config.key_format == "string" else set())
    for item in config.partition_by:
        transform = parse_transform(item)
        column = transform.column if transform is not None else item  # validated in config
        if column not in names:
            raise ConfigError(f"partition_by: {item!r} refers to {column!r}, which the registry's schema does not have")
    return fields


def evolved(
    fields: Sequence[Declared], writers: Sequence[WriterSchema], renames: dict[str, str], *, key: bool = False
) -> list[Declared]:
    """``fields`` evolved to take ``writers``' records (with ``key``: their keys, into the key
    column); :class:`~ingest.errors.SchemaChangeRefused` where Iceberg cannot follow."""
    fields = list(fields)
    for writer in writers:
        try:
            if key:  # the key column alone, in its place: the value columns are not the key writer's
                column = merge([f for f in fields if f.name == KEY_COLUMN], [keys.key_field(writer)])
                evolved = [
                    column.fields[0] if f.name == KEY_COLUMN else Field(f.name, f.type, f.required, f.doc)
                    for f in fields
                ]
                merged = Merged(tuple(evolved), column.problems)
            else:
                merged = merge(fields, renamed(formats.fields_of(writer), renames))
        except ValueError as error:
            what = "a key column" if key else "a table's schema"
            raise SchemaChangeRefused(f"schema id {writer.schema_id} cannot be {what}: {error}") from None
        if merged.problems:
            raise SchemaChangeRefused(
                f"schema id {writer.schema_id} changes a column's type in a way Iceberg cannot follow: "
                f"{'; '.join(merged.problems)}. Nothing was committed. Set `on_schema_change: dead_letter` to set "
                "such records aside, or write the topic into a new table."
            )
        fields = list(merged.fields)
    return fields


@dataclass(frozen=True)
class IcebergTableMaker:
    """``route_by``'s tables in an Iceberg catalog (a :class:`~ingest.ports.TableMaker`): created
    with the config's partitioning, properties and sort order, renames applied with the first commit."""

    catalog: Catalog
    config: PipelineConfig
    sort_by: Sequence[SortKey]

    def open(self, name: str, fields: Sequence[Declared]) -> IcebergTable:
        schema = rows_schema(fields)
        return IcebergTable.load_or_create(
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
        return table.misfit(schema, spec, self.config.table_properties, self.sort_by)


def routes(config: PipelineConfig, planned: Layout) -> Routes:
    """The tables ``route_by`` routes ``config``'s records to that there are: those of
    ``route_by.table``'s namespace whose names it makes and that this pipeline has committed to
    (whatever ``allow`` says now: ``verify`` counts their rows). Another table the template names
    is opened when records first name it."""
    assert config.route_by is not None and planned.catalog is not None
    prefix, _, suffix = config.route_by.table.partition(ROUTE_VALUE)
    routed = Routes(config, IcebergTableMaker(planned.catalog, config, planned.sort_by), {})
    names = []
    for name in IcebergTable.names_in(planned.catalog, config.route_by.namespace):
        value = name[len(prefix) : len(name) - len(suffix)]
        if not (name.startswith(prefix) and name.endswith(suffix) and ROUTE_VALUE_CHARS.fullmatch(value)):
            continue
        table = IcebergTable.existing(planned.catalog, name)
        if table is not None and config.pipeline in registered_pipelines(table.head().properties):
            names.append(name)
    routed.create(names, planned.fields)
    return routed
