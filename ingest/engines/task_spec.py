"""What a task is given, and the decoder it makes of it.

:class:`TaskSpec` is the slice of a pipeline's config a task needs and nothing more: it crosses to
worker processes and Spark executors, so it carries no catalog properties (no catalog credentials).
From it a task builds the decoder of its records (:meth:`TaskSpec.decoder`): the values in their
format (JSON, plain Avro, or a registry format), the keys with ``key_format``, the headers column,
values refused or set aside as dead letters, and ``route_by``'s mark of each row's table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingest.config import OnSchemaChange, PipelineConfig, schema_file_text
from ingest.formats.json import Decoder
from ingest.formats.rows import NotFinite, SizeLimited, WithHeaders
from ingest.ports import SchemaRegistry, ValueDecoder
from ingest.records import HEADERS_COLUMN, KEY_COLUMN, Declared, Field
from ingest.route_by.decoding import Route, Routing, route_of
from ingest.route_by.writing import RoutedTables

if TYPE_CHECKING:
    from ingest.formats.wire import RegistryDecoder


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
        values_in_registry = self.format != "json" and self.schema_text is None
        if values_in_registry or self.key_format not in (None, "string"):  # keys and values share the client
            from ingest.kafka.registry import Registry  # the registry client costs ~130 ms to import

            registry = Registry(self.registry or {})  # config requires it for these formats
        if self.key_format is None:
            return self._values(fields, registry)
        from ingest.formats import keys

        values = self._values(keys.value_fields(fields), registry)
        if self.key_format == "string":
            return keys.KeyedDecoder(self._rows_fields(fields), values, keys.StringKeys())
        assert registry is not None  # checked in config
        key = next(f for f in fields if f.name == KEY_COLUMN)  # the pipeline adds it
        make = self._registry_format(self.key_format, {})
        reader = keys.RegistryKeys(key, registry, make, avro=self.key_format == "avro")
        return keys.KeyedDecoder(self._rows_fields(fields), values, reader)

    def _rows_fields(self, fields: Sequence[Declared]) -> Sequence[Declared]:
        """The fields of the rows the keyed decoder makes: with ``headers``, the headers column too
        (``WithHeaders`` fills it); without, not even if the table has one (it stays null)."""
        return self.fields if self.headers else fields

    def _values(self, fields: Sequence[Declared], registry: SchemaRegistry | None) -> ValueDecoder:
        if self.format == "json":
            return Decoder(fields, self.renames, self.unknown_fields, frozenset(self.refuse))
        if self.schema_text is not None:
            from ingest.formats.avro import AvroFileDecoder

            return AvroFileDecoder(fields, self.schema_text, self.renames)
        assert registry is not None  # checked in config
        return self._registry_format(self.format, self.renames)(fields, registry)

    def _registry_format(
        self, name: str, renames: Mapping[str, str]
    ) -> Callable[[Sequence[Declared], SchemaRegistry], RegistryDecoder]:
        """A registry format's decoder, given the fields and the registry."""
        # imported here: polars costs a JSON pipeline's workers ~90 ms at start
        from ingest.formats.avro import AvroDecoder
        from ingest.formats.json_schema import JsonSchemaDecoder
        from ingest.formats.protobuf import ProtobufDecoder

        formats: dict[str, type[RegistryDecoder]] = {
            "avro": AvroDecoder,
            "protobuf": ProtobufDecoder,
            "json_schema": JsonSchemaDecoder,
        }
        decoder = formats[name]
        return lambda fields, registry: decoder(fields, registry, self.on_schema_change, renames)
