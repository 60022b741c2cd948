"""What a task is given, and the decoder it makes of it.

:class:`TaskSpec` is the slice of a pipeline's config a task needs and nothing more: it crosses to
worker processes and Spark executors, so it carries no catalog properties (no catalog credentials).
From it a task builds the decoder of its records (:meth:`TaskSpec.decoder`): the values in their
format (JSON, plain Avro, or a registry format), the keys with ``key_format``, the headers column,
values refused or set aside as dead letters, and ``route_by``'s mark of each row's table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ingest.config import PipelineConfig, schema_file_text
from ingest.format_names import REGISTRY_FORMATS, OnSchemaChange
from ingest.formats.changelog import DebeziumChanges, UpsertChanges, debezium_fields, row_of
from ingest.formats.decoders import Decoding, key_decoder, value_decoder
from ingest.formats.keys import KeyedDecoder, value_fields
from ingest.formats.rows import NotFinite, SizeLimited, WithHeaders
from ingest.ports import ValueDecoder
from ingest.records import HEADERS_COLUMN, KEY_COLUMN, Declared, Field
from ingest.route_by.decoding import Route, Routing, route_of
from ingest.route_by.writing import RoutedTables


@dataclass(frozen=True)
class TaskSpec:
    """What a task needs from the pipeline's config, and nothing more: it crosses to worker
    processes and Spark executors, so it carries no catalog properties (no catalog credentials)."""

    #: librdkafka properties (a task reads Kafka with them)
    kafka: Mapping[str, str | int | float | bool]
    topics: tuple[str, ...]
    group_id: str
    read_timeout_s: float
    #: the rows table's fields the values are decoded into (the table's schema, evolved for the batch)
    fields: tuple[Field, ...]
    #: decoded rows written together (see ``batch.chunk_records``)
    chunk_records: int
    #: the values' format (``format:`` of the topics)
    format: str = "json"
    #: Schema Registry client properties, for the registry formats
    registry: Mapping[str, str | int | float | bool] | None = None
    on_schema_change: OnSchemaChange = "evolve"
    #: the writer schema of plain Avro values (``schema_file:``), as text: tasks may run where the file is not
    schema_text: str | None = None
    #: the keys' format (``key_format:`` of the topics), decoded into the key column; None: raw only
    key_format: str | None = None
    #: top-level fields the writers renamed, old name → the table's (``renames:``)
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: a longer value is a dead letter (``dead_letters.max_value_bytes``); None: no limit of ours
    max_value_bytes: int | None = None
    #: JSON fields the table does not declare: dropped, captured into ``_extra``, or dead letters
    unknown_fields: str = "drop"
    #: values refused as dead letters (``refuse:``)
    refuse: tuple[str, ...] = ()
    #: each record's headers as the column ``_kafka_headers`` (``headers: true``)
    headers: bool = False
    #: ``route_by``: each row marked with the table its value names
    route: Route | None = None
    #: ``changes:``: the envelope (``debezium``, ``upsert``) and the key columns; the rows are changes
    changes: tuple[str, tuple[str, ...]] | None = None

    @classmethod
    def of(cls, config: PipelineConfig, fields: Sequence[Declared]) -> TaskSpec:
        return cls(
            dict(config.kafka),
            tuple(config.topics),
            config.group_id,
            config.batch.read_timeout_s,
            tuple(Field(f.name, f.type, f.required, f.doc) for f in fields),
            config.batch.chunk_records,
            config.format,
            dict(config.schema_registry) if config.schema_registry else None,
            config.on_schema_change,
            schema_file_text(config.schema_file) if config.schema_file else None,
            config.key_format,
            dict(config.renames),
            config.dead_letter_policy.max_value_bytes,
            config.unknown_fields,
            tuple(config.refuse),
            config.headers,
            route_of(config),
            (config.changes.envelope, tuple(config.changes.key)) if config.changes is not None else None,
        )

    def decoder(self, routed: RoutedTables | None = None) -> ValueDecoder:
        """The decoder of this task's records: their values, and their keys with ``key_format``,
        values over ``max_value_bytes`` set aside first; with ``route``, each row marked with its
        table, but for the tables ``routed`` refuses (:class:`ingest.route_by.decoding.Routing`)."""
        decoder = self._decoder([f for f in self.fields if f.name != HEADERS_COLUMN])
        if "nan" in self.refuse:
            decoder = NotFinite(decoder)
        if self.max_value_bytes is not None:
            decoder = SizeLimited(decoder, self.max_value_bytes)
        if self.headers:
            decoder = WithHeaders(decoder, self.fields)
        return Routing(decoder, self.route, routed) if self.route is not None else decoder

    def _decoder(self, fields: Sequence[Declared]) -> ValueDecoder:
        """The decoder of the keys and the values, the values into ``fields`` (the table's but the
        headers column; the keyed decoder's rows keep it, the column ``WithHeaders`` fills)."""
        registry = None
        values_in_registry = self.format in REGISTRY_FORMATS and self.schema_text is None
        if values_in_registry or self.key_format in REGISTRY_FORMATS:  # keys and values share the client
            from ingest.kafka.registry import Registry  # the registry client costs ~130 ms to import

            registry = Registry(self.registry or {})  # config requires it for these formats
        envelope, key_columns = self.changes if self.changes is not None else (None, ())
        decoding = Decoding(
            self.on_schema_change,
            self.renames,
            self.unknown_fields,
            frozenset(self.refuse),
            self.schema_text,
            row_of(envelope),
        )
        read: Sequence[Declared] = value_fields(fields)
        if envelope == "debezium":  # (the JSON converter may wrap the event beside its schema)
            read = debezium_fields(read, wrapped=self.format == "json")
        values = value_decoder(self.format, read, decoding, registry)
        if envelope == "debezium":
            values = DebeziumChanges(values, key_columns)
        if self.key_format is None:
            return values
        key = next(f for f in fields if f.name == KEY_COLUMN)  # the pipeline adds it
        keys = key_decoder(self.key_format, key, self.on_schema_change, registry)
        keyed = KeyedDecoder(self._rows_fields(fields), values, keys)
        return UpsertChanges(keyed, keys, key_columns, fields) if envelope == "upsert" else keyed

    def _rows_fields(self, fields: Sequence[Declared]) -> Sequence[Declared]:
        """The fields of the rows the keyed decoder makes: with ``headers``, the headers column too
        (``WithHeaders`` fills it); without, not even if the table has one (it stays null)."""
        return self.fields if self.headers else fields
