"""The rows table's fields (:class:`~ingest.records.Declared`): from ``schema:``, a schema file or
the registry subjects' latest schemas when a pipeline opens (:mod:`ingest.assembly` adds an existing
table's), and evolved to take the writer schemas its records turn out to need (:func:`evolved`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from ingest.config import PipelineConfig, TopicSource, schema_file_text
from ingest.errors import ConfigError, SchemaChangeRefused, SubjectNotFound
from ingest.format_names import REGISTRY_FORMATS
from ingest.formats.avro_schema import record_fields
from ingest.formats.changelog import row_of as row_of_envelope
from ingest.formats.decoders import key_field, writer_fields
from ingest.formats.wire import RowOf
from ingest.ports import SchemaRegistry, WriterSchema
from ingest.records import KEY_COLUMN, Declared, Field, Merged, merge, parse_transform, renamed


def from_schema_file(config: PipelineConfig) -> list[Field] | None:
    """The fields of the Avro schema file of plain Avro topics (``schema_file:``), if any; with
    ``schema:`` declared too, the file's records must fit it."""
    if config.schema_file is None:
        return None
    text = schema_file_text(config.schema_file)
    row = row_of(config)
    try:
        own = renamed(record_fields(text), config.renames)
        own = row(own) if row is not None else own
    except ValueError as error:
        raise ConfigError(f"schema_file {config.schema_file} cannot be a table's schema: {error}") from None
    if config.schema_:
        problems = merge(config.schema_, own).problems
        if problems:
            raise ConfigError(f"schema_file {config.schema_file} does not fit `schema:`: {'; '.join(problems)}")
        return None
    return own


def row_of(config: PipelineConfig) -> RowOf | None:
    """How a value's writer fields give the row's, where a value is a change event around its row
    (``changes.envelope: debezium``: the event's ``after`` record); None: a value is its row."""
    return row_of_envelope(config.changes.envelope if config.changes is not None else None)


def values_in_registry(config: PipelineConfig) -> bool:
    return config.format in REGISTRY_FORMATS and config.schema_file is None


def key_field_of(config: PipelineConfig, registry: SchemaRegistry | None) -> Field:
    """The key column of a table that has none yet: a string, or the latest schemas of the topics'
    key subjects, merged."""
    if config.key_format == "string":
        return Field(KEY_COLUMN, "string", False)
    assert registry is not None  # config requires a registry then
    fix = "Fix the subject, set `key_subject:`, or leave `key_format:` out to keep keys raw."
    merged = _merged_subjects(config, lambda t: latest_key(registry, t), lambda w: [key_field(w)], "key", fix)
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


def from_subjects(config: PipelineConfig, registry: SchemaRegistry | None) -> list[Field]:
    """The rows table's fields when ``schema:`` is omitted: the latest schemas of the topics'
    subjects, merged (in the order of ``topics:``)."""
    assert registry is not None  # config requires a registry format then
    row = row_of(config)
    fields = _merged_subjects(
        config,
        lambda t: registry.latest(t.value_subject),
        lambda w: renamed(writer_fields(w), config.renames) if row is None else row(writer_fields(w)),
        "value",
        "Declare `schema:` for the fields you want, or fix the subject.",
    )
    names = {f.name for f in fields} | ({KEY_COLUMN} if config.key_format == "string" else set())
    if config.changes is not None and (missing := [c for c in config.changes.key if c not in names]):
        raise ConfigError(
            f"changes.key: {missing} not in the latest schema of the topics' subjects (the key columns are fields "
            f"of the rows{', the after record of a Debezium event' if row is not None else ''}); fix `changes.key`"
        )
    for item in config.partition_by:
        transform = parse_transform(item)
        column = transform.column if transform is not None else item  # validated in config
        if column not in names:
            raise ConfigError(f"partition_by: {item!r} refers to {column!r}, which the registry's schema does not have")
    return fields


def evolved(
    fields: Sequence[Declared],
    writers: Sequence[WriterSchema],
    renames: dict[str, str],
    *,
    key: bool = False,
    row: RowOf | None = None,
) -> list[Declared]:
    """``fields`` evolved to take ``writers``' records (with ``key``: their keys, into the key
    column; with ``row``, the rows inside their values: :func:`row_of`);
    :class:`~ingest.errors.SchemaChangeRefused` where Iceberg cannot follow."""
    fields = list(fields)
    for writer in writers:
        try:
            if key:  # the key column alone, in its place: the value columns are not the key writer's
                column = merge([f for f in fields if f.name == KEY_COLUMN], [key_field(writer)])
                evolved = [
                    column.fields[0] if f.name == KEY_COLUMN else Field(f.name, f.type, f.required, f.doc)
                    for f in fields
                ]
                merged = Merged(tuple(evolved), column.problems)
            else:
                own = renamed(writer_fields(writer), renames)
                merged = merge(fields, row(own) if row is not None else own)
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
