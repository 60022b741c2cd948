"""Record value formats: each turns chunks of Kafka values into rows of the table's fields
(:class:`ingest.ports.ValueDecoder`), and the registry formats map a writer schema to fields."""

from __future__ import annotations

from ingest.ports import WriterSchema
from ingest.records import Field


def fields_of(writer: WriterSchema) -> list[Field]:
    """The table fields of a registry schema (raises ValueError saying what does not map)."""
    if writer.kind == "AVRO":
        from ingest.formats import avro  # polars is imported only where Avro is read (~90 ms)

        return avro.record_fields(writer.text, writer.references)
    if writer.kind == "PROTOBUF":
        from ingest.formats import protobuf

        return protobuf.message_fields(writer)
    if writer.kind == "JSON":
        from ingest.formats import json_schema

        return json_schema.object_fields(writer.text, writer.references)
    raise ValueError(f"schema id {writer.schema_id} is a {writer.kind} schema, which this version cannot read yet")
