"""Each format's decoders, by the names of :data:`ingest.format_names.FORMATS`: the one place a
format's name becomes code.

:data:`DECODERS` says how each format's decoders are made; which a format has must be what its row
of the formats table says it can do (checked when this module is imported: a format added to one
and not the other stops every command at its start). The registry formats' decoder classes are
imported when first used: polars, Avro's reader, costs a JSON pipeline's workers ~90 ms at start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ingest.format_names import BY_REGISTRY_KIND, FORMATS, Format, OnSchemaChange
from ingest.formats.json import Decoder
from ingest.formats.keys import KeyDecoder, RegistryKeys, StringKeys, key_column, wrapped
from ingest.formats.wire import RegistryDecoder, RowOf
from ingest.ports import SchemaRegistry, ValueDecoder, WriterSchema
from ingest.records import Declared, Field


@dataclass(frozen=True)
class Decoding:
    """What decoding a table's records takes besides its fields: the config's slice for it."""

    #: records of a writer schema the table lacks: read once the table evolves, a batch stopped, dead letters
    on_schema_change: OnSchemaChange = "evolve"
    #: top-level fields the writers renamed, old name → the table's (``renames:``)
    renames: Mapping[str, str] = field(default_factory=dict)
    #: JSON fields the table does not declare: dropped, captured into ``_extra``, or dead letters
    unknown_fields: str = "drop"
    #: values refused as dead letters (``refuse:``)
    refuse: frozenset[str] = frozenset()
    #: the writer schema of values without a registry (``schema_file:``), as text
    schema_text: str | None = None
    #: the row fields of a value's, where a value is a change event around its row (Debezium's);
    #: None: a value is its row
    row: RowOf | None = None


@dataclass(frozen=True)
class Decoders:
    """How one format's decoders are made; None for what it has not (its row says what it has)."""

    #: a decoder of values without a registry, into the table's fields
    values: Callable[[Sequence[Declared], Decoding], ValueDecoder] | None = None
    #: a decoder of keys without a registry, into the key column
    keys: Callable[[], KeyDecoder] | None = None
    #: a registry format's decoder class: its values, its keys and its writer schemas' fields
    registry: Callable[[], type[RegistryDecoder]] | None = None
    #: a decoder of plain values of the writer schema of a file (``schema_file:``): fields, schema text, renames
    file: Callable[[Sequence[Declared], str, Mapping[str, str]], ValueDecoder] | None = None


def _json(fields: Sequence[Declared], decoding: Decoding) -> ValueDecoder:
    return Decoder(fields, decoding.renames, decoding.unknown_fields, decoding.refuse)


def _avro() -> type[RegistryDecoder]:
    from ingest.formats.avro import AvroDecoder

    return AvroDecoder


def _avro_file(fields: Sequence[Declared], schema_text: str, renames: Mapping[str, str]) -> ValueDecoder:
    from ingest.formats.avro import AvroFileDecoder

    return AvroFileDecoder(fields, schema_text, renames)


def _protobuf() -> type[RegistryDecoder]:
    from ingest.formats.protobuf import ProtobufDecoder

    return ProtobufDecoder


def _json_schema() -> type[RegistryDecoder]:
    from ingest.formats.json_schema import JsonSchemaDecoder

    return JsonSchemaDecoder


#: each format's decoders by its name
DECODERS = {
    "json": Decoders(values=_json),
    "string": Decoders(keys=StringKeys),
    "avro": Decoders(registry=_avro, file=_avro_file),
    "protobuf": Decoders(registry=_protobuf),
    "json_schema": Decoders(registry=_json_schema),
}


def disagreements(formats: Sequence[Format], decoders: Mapping[str, Decoders]) -> list[str]:
    """Where ``decoders`` do not make what the ``formats`` rows say each can do (none: they agree)."""
    found = [f"{name}: decoders of no format" for name in decoders.keys() - {f.name for f in formats}]
    for row in formats:
        made = decoders.get(row.name)
        if made is None:
            found.append(f"{row.name}: no decoders")
            continue
        have = {
            "registry": made.registry is not None,
            "schema_file": made.file is not None,
            "values": made.values is not None or made.registry is not None,
            "keys": made.keys is not None or made.registry is not None,
        }
        said = {"registry": row.registry, "schema_file": row.schema_file, "values": row.values, "keys": row.keys}
        found += [
            f"{row.name}: its row says {what}={said[what]}, its decoders {have[what]}"
            for what in have
            if have[what] != said[what]
        ]
        if made.registry is not None and (made.values is not None or made.keys is not None):
            found.append(f"{row.name}: a registry format's decoder class decodes its values and keys")
    return found


if problems := disagreements(FORMATS, DECODERS):
    raise ImportError(f"ingest.formats.decoders disagrees with ingest.format_names.FORMATS: {'; '.join(problems)}")


def value_decoder(
    name: str, fields: Sequence[Declared], decoding: Decoding, registry: SchemaRegistry | None
) -> ValueDecoder:
    """The decoder of values in format ``name`` into the table's ``fields`` (``registry``: the
    client for a registry format, which config requires then)."""
    made = DECODERS[name]
    if decoding.schema_text is not None and made.file is not None:
        return made.file(fields, decoding.schema_text, decoding.renames)
    if made.registry is not None:
        assert registry is not None  # checked in config
        return made.registry()(fields, registry, decoding.on_schema_change, decoding.renames, decoding.row)
    assert made.values is not None  # config takes only value formats as `format:`
    return made.values(fields, decoding)


def key_decoder(name: str, key: Declared, on_change: OnSchemaChange, registry: SchemaRegistry | None) -> KeyDecoder:
    """The decoder of keys in format ``name`` into the key column ``key``."""
    made = DECODERS[name]
    if made.registry is not None:
        assert registry is not None  # checked in config
        return RegistryKeys(key, registry, made.registry(), on_change)
    assert made.keys is not None  # config takes only key formats as `key_format:`
    return made.keys()


def writer_fields(writer: WriterSchema) -> list[Field]:
    """The table fields of a registry writer schema, by its format (raises ValueError saying what
    does not map)."""
    row = BY_REGISTRY_KIND.get(writer.kind)
    load = DECODERS[row.name].registry if row is not None else None
    if load is None:
        raise ValueError(f"schema id {writer.schema_id} is a {writer.kind} schema, which this version cannot read yet")
    return load().writer_fields(writer)


def key_field(writer: WriterSchema) -> Field:
    """The key column of a key writer schema (raises ValueError saying what does not map)."""
    return key_column(writer, writer_fields(wrapped(writer)))
