"""Protobuf values in the Confluent wire format: the 5-byte prefix, the message indexes (which
message of the schema's file: a zigzag-varint count, then each index; a single zero byte for the
first message), then the message.

The writer schema is fetched from the registry as a serialized ``FileDescriptorProto`` and built
into a descriptor pool with the well-known types, so messages are parsed by protobuf's own runtime
(upb) without generated classes. Unlike Avro there is no columnar reader for Protobuf here: each
message is parsed and turned into a row in Python, then the rows into Arrow at once; this format
is correct first, and measured in docs/performance.md, not fast.

The table's message is the top-level message of the subject's file that no other message refers
to (a file of ``Order`` and its ``Line`` gives ``Order``); a record written as another message is a
dead letter naming it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from ingest.format_names import FORMAT
from ingest.formats.wire import PREFIX, Parts, Reading, Refused, RegistryDecoder, dependencies
from ingest.ports import WriterSchema
from ingest.records import OWN_COLUMNS, Field, renaming

_WELL_KNOWN = (any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)
_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT64: "long",
    FieldDescriptor.TYPE_SINT64: "long",
    FieldDescriptor.TYPE_SFIXED64: "long",
    FieldDescriptor.TYPE_UINT64: "decimal(20,0)",
    FieldDescriptor.TYPE_FIXED64: "decimal(20,0)",
    FieldDescriptor.TYPE_INT32: "int",
    FieldDescriptor.TYPE_SINT32: "int",
    FieldDescriptor.TYPE_SFIXED32: "int",
    FieldDescriptor.TYPE_UINT32: "long",
    FieldDescriptor.TYPE_FIXED32: "long",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "binary",
    FieldDescriptor.TYPE_ENUM: "string",
}
_UNSIGNED_64 = (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64)
_WRAPPERS = {
    "google.protobuf.DoubleValue": "double",
    "google.protobuf.FloatValue": "float",
    "google.protobuf.Int64Value": "long",
    "google.protobuf.UInt64Value": "decimal(20,0)",
    "google.protobuf.Int32Value": "int",
    "google.protobuf.UInt32Value": "long",
    "google.protobuf.BoolValue": "boolean",
    "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "binary",
}
_TIMESTAMP = "google.protobuf.Timestamp"


def _file(writer: WriterSchema) -> FileDescriptor:
    """The writer's file, built in a pool of its own with the well-known types and the files it
    imports (the schema's references, each named by its import path, as the serializer registered them)."""
    pool = DescriptorPool()
    for module in _WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    added = {module.DESCRIPTOR.name for module in _WELL_KNOWN}

    def add(schema: WriterSchema, name: str | None) -> FileDescriptor:
        proto = _proto(schema)
        if name is not None:
            proto.name = name
            added.add(name)
        missing = [d for d in proto.dependency if d not in added]
        if missing:
            raise Refused(
                f"{proto.name or 'its file'} imports {', '.join(missing)}, which the registry holds no reference "
                "for; register the schema with its references (confluent-kafka's serializers do)"
            )
        try:
            return pool.Add(proto)  # type: ignore[no-any-return]
        except (TypeError, KeyError) as error:
            raise Refused(f"its descriptor does not build: {error}") from None

    for name, referenced in dependencies(writer.references):  # each after the files it imports
        if name not in added:
            add(referenced, name)
    return add(writer, None)


def _proto(writer: WriterSchema) -> descriptor_pb2.FileDescriptorProto:
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(writer.text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        raise Refused(
            f"schema id {writer.schema_id} came back as .proto source, not as a serialized descriptor "
            "(GET /schemas/ids/{id}?format=serialized); this version reads only the serialized form"
        ) from None


def _table_message(file: FileDescriptor) -> Descriptor:
    """The top-level message no other message of the file refers to."""
    messages = list(file.message_types_by_name.values())
    used = {f.message_type.full_name for m in messages for f in _all_fields(m) if f.message_type is not None}
    roots = [m for m in messages if m.full_name not in used]
    if len(roots) != 1:
        names = ", ".join(m.name for m in roots or messages)
        raise Refused(f"the file has {len(roots)} top-level messages no other uses ({names}); which is the table's?")
    return roots[0]


def _all_fields(message: Descriptor) -> list[FieldDescriptor]:
    nested = [f for m in message.nested_types for f in _all_fields(m)]
    return [*message.fields, *nested]


def _is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def _type(field: FieldDescriptor, where: str, open_: frozenset[str]) -> str:
    """The table type of one field (refused: groups, recursion, Any/Struct/Duration)."""
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"map<{_type(key, where, open_)}, {_type(value, where, open_)}>"
    kind = _element(field, where, open_)
    return f"list<{kind}>" if field.is_repeated else kind


def _element(field: FieldDescriptor, where: str, open_: frozenset[str]) -> str:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        raise Refused(f"{where}: a proto2 group has no Iceberg column type")
    name = field.message_type.full_name
    if name == _TIMESTAMP:
        return "timestamptz"
    if name in _WRAPPERS:
        return _WRAPPERS[name]
    if name.startswith("google.protobuf."):
        raise Refused(f"{where}: {name} has no Iceberg column type")
    if name in open_:
        raise Refused(f"{where}: message {name} contains itself; recursive types have no Iceberg form")
    inner = ", ".join(f"{f.name}: {_type(f, f'{where}.{f.name}', open_ | {name})}" for f in field.message_type.fields)
    return f"struct<{inner}>"


def _fields(message: Descriptor) -> list[Field]:
    fields = []
    for field in message.fields:
        if field.name in OWN_COLUMNS:
            raise Refused(f"{field.name}: the pipeline adds a column of that name itself")
        required = bool(field.is_required)  # proto2 only; proto3 fields may be absent
        fields.append(Field(field.name, _type(field, field.name, frozenset({message.full_name})), required))
    return fields


def message_fields(writer: WriterSchema) -> list[Field]:
    """The table fields of the table's message of a Protobuf schema: scalars as their Iceberg types
    (unsigned 32-bit as long, unsigned 64-bit as decimal(20,0)), enums as their names, messages as
    structs, repeated fields as lists, maps as maps, ``Timestamp`` as timestamptz, the wrapper types
    as optional scalars."""
    return _fields(_table_message(_file(writer)))


# --- messages to rows ---------------------------------------------------------------------------


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if field.type in _UNSIGNED_64:
        return Decimal(value)
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return value
    name = field.message_type.full_name
    if name == _TIMESTAMP:
        return value.ToDatetime(tzinfo=dt.UTC)
    if name in _WRAPPERS:
        return Decimal(value.value) if name == "google.protobuf.UInt64Value" else value.value
    return _row(value)


def _row(message: Message) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            row[field.name] = [(k, _value(value_field, v)) for k, v in value.items()]
        elif field.is_repeated:
            row[field.name] = [_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            row[field.name] = None
        else:
            row[field.name] = _value(field, value)
    return row


def _indexes(value: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes after the prefix, and where the message starts."""
    position = PREFIX

    def varint() -> int:
        nonlocal position
        shift = result = 0
        while True:
            if position >= len(value):
                raise DecodeError("the message indexes are truncated")
            byte = value[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    count = varint()
    if count == 0:
        return (0,), position
    if not 0 < count < 100:
        raise DecodeError(f"{count} message indexes")
    return tuple(varint() for _ in range(count)), position


class ProtobufDecoder(RegistryDecoder):
    """Decodes Confluent-framed Protobuf values into rows of the table's ``fields``."""

    format = FORMAT["protobuf"]

    @staticmethod
    def writer_fields(writer: WriterSchema) -> list[Field]:
        return message_fields(writer)

    def plan(self, writer: WriterSchema) -> tuple[Descriptor, type[Message], tuple[int, ...]]:
        """The table's message, its class, and its message indexes in the file."""
        file = _file(writer)
        message = _table_message(file)
        top = list(file.message_types_by_name.values())
        return message, GetMessageClass(message), (top.index(message),)

    def decode_group(
        self, reading: Reading, values: list[bytes | None], index: Sequence[int], parts: Parts, bad: dict[int, str]
    ) -> None:
        descriptor, cls, indexes = reading.plan
        names = renaming([f.name for f in descriptor.fields], self.renames)
        rows: list[dict[str, Any]] = []
        good: list[int] = []
        for i in index:
            value = values[i]
            assert value is not None
            try:
                written_as, start = _indexes(value)
                if written_as != indexes:
                    bad[i] = (
                        f"written as message {list(written_as)} of schema id {reading.schema_id}; the table reads "
                        f"{descriptor.full_name} ({list(indexes)})"
                    )
                    continue
                row = _row(cls.FromString(value[start:]))
                rows.append({names.get(k, k): v for k, v in row.items()} if names else row)
            except DecodeError as error:
                bad[i] = (
                    f"does not decode as Protobuf {descriptor.full_name} with schema id {reading.schema_id} "
                    f"({error}): truncated, corrupt, or written with another schema than its prefix names"
                )
                continue
            good.append(i)
        if not good:
            return
        try:
            parts.append((good, pa.Table.from_pylist(rows, schema=self._field_schema)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:  # a value the table's type cannot hold
            for i, row in zip(good, rows, strict=True):
                try:
                    parts.append(([i], pa.Table.from_pylist([row], schema=self._field_schema)))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    bad[i] = f"a value does not fit the table's columns: {error}"
