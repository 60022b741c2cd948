"""The Protobuf format: a writer's file descriptor mapped to table fields, and Confluent-framed
messages (prefix, message indexes, message) decoded into rows, poison split off. Messages are
built from descriptors made here, as a producer's generated classes would make them."""

from __future__ import annotations

import base64
import datetime as dt
import struct
from decimal import Decimal
from typing import Any, Protocol

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2, wrappers_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from ingest.formats.protobuf import ProtobufDecoder, message_fields
from ingest.formats.wire import Refused
from ingest.ports import WriterSchema
from ingest.records import Field
from tests.unit.test_json_schema import chunk

F = descriptor_pb2.FieldDescriptorProto


def order_file(*, extra: bool = False, recursive: bool = False) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    file.dependency.extend(["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    status = file.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    line = file.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    if recursive:
        line.field.add(name="next", number=3, type=F.TYPE_MESSAGE, type_name=".shop.Line", label=F.LABEL_OPTIONAL)
    order = file.message_type.add(name="Order")
    add = order.field.add
    add(name="order_id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add(name="status", number=2, type=F.TYPE_ENUM, type_name=".shop.Status", label=F.LABEL_OPTIONAL)
    add(name="lines", number=3, type=F.TYPE_MESSAGE, type_name=".shop.Line", label=F.LABEL_REPEATED)
    add(
        name="created_at", number=4, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL
    )
    add(name="note", number=5, type=F.TYPE_MESSAGE, type_name=".google.protobuf.StringValue", label=F.LABEL_OPTIONAL)
    add(name="big", number=6, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    add(name="amount", number=7, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL, proto3_optional=True, oneof_index=0)
    order.oneof_decl.add(name="_amount")
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add(name="attrs", number=8, type=F.TYPE_MESSAGE, type_name=".shop.Order.AttrsEntry", label=F.LABEL_REPEATED)
    if extra:
        add(name="coupon", number=9, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return file


def classes(file: descriptor_pb2.FileDescriptorProto) -> Any:
    pool = DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def writer(schema_id: int, file: descriptor_pb2.FileDescriptorProto) -> WriterSchema:
    return WriterSchema(schema_id, "PROTOBUF", base64.b64encode(file.SerializeToString()).decode())


class Registry:
    def __init__(self, *writers: WriterSchema) -> None:
        self.schemas = {w.schema_id: w for w in writers}

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self.schemas.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        return self.schemas[max(self.schemas)]


class Message(Protocol):
    """What :func:`framed` needs of a Protobuf message (protobuf ships no type hints)."""

    def SerializeToString(self) -> bytes: ...


def framed(schema_id: int, message: Message, indexes: bytes = b"\x02\x02") -> bytes:
    """Order is the second top-level message: indexes [1] (count 1, index 1, zigzag varints)."""
    return struct.pack(">bI", 0, schema_id) + indexes + message.SerializeToString()


def test_a_file_descriptor_maps_to_table_fields() -> None:
    fields = {f.name: (f.type, f.required) for f in message_fields(writer(1, order_file()))}

    assert fields == {
        "order_id": ("long", False),
        "status": ("string", False),
        "lines": ("list<struct<sku: string, qty: int>>", False),
        "created_at": ("timestamptz", False),
        "note": ("string", False),
        "big": ("decimal(20,0)", False),
        "amount": ("double", False),
        "attrs": ("map<string, long>", False),
    }


def test_what_has_no_table_form_is_refused_saying_why() -> None:
    with pytest.raises(Refused, match=r"message shop\.Line contains itself"):
        message_fields(writer(1, order_file(recursive=True)))
    with pytest.raises(Refused, match=r"came back as \.proto source"):
        message_fields(WriterSchema(1, "PROTOBUF", 'syntax = "proto3"; message A { int64 a = 1; }'))


def test_messages_decode_into_rows_and_poison_into_dead_letters() -> None:
    order = classes(order_file())
    first = order(order_id=1, status=1, big=2**64 - 1, amount=2.5)
    first.lines.add(sku="a", qty=2)
    first.created_at.FromDatetime(dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC))
    first.note.value = "hi"
    first.attrs["w"] = 3
    second = order(order_id=2)
    values: list[bytes | None] = [
        framed(1, first),
        framed(1, second),
        framed(1, first)[:-3],
        framed(1, order(order_id=4), indexes=b"\x00"),  # written as the file's first message (Line)
    ]
    decoder = ProtobufDecoder(message_fields(writer(1, order_file())), Registry(writer(1, order_file())), "evolve")

    decoded = decoder.decode(chunk(values))

    rows = decoded.rows.to_pylist()
    assert [r["order_id"] for r in rows] == [1, 2]
    assert rows[0]["status"] == "PAID" and rows[0]["lines"] == [{"sku": "a", "qty": 2}]
    assert rows[0]["created_at"] == dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)
    assert rows[0]["note"] == "hi" and rows[0]["big"] == Decimal(2**64 - 1) and rows[0]["amount"] == 2.5
    assert rows[0]["attrs"] == [("w", 3)]
    assert rows[1]["note"] is None and rows[1]["amount"] is None and rows[1]["status"] == "NEW"
    errors = dict(
        zip(decoded.dead_letters["offset"].to_pylist(), decoded.dead_letters["error"].to_pylist(), strict=True)
    )
    assert errors[102].startswith("does not decode as Protobuf shop.Order with schema id 1")
    assert errors[103].startswith("written as message [0] of schema id 1; the table reads shop.Order ([1])")


def test_a_writer_schema_with_a_new_field_reads_as_null_in_older_rows_once_the_table_has_it() -> None:
    old, new = writer(1, order_file()), writer(2, order_file(extra=True))
    decoder = ProtobufDecoder(message_fields(new), Registry(old, new), "fail")
    values: list[bytes | None] = [
        framed(1, classes(order_file())(order_id=1)),
        framed(2, classes(order_file(extra=True))(order_id=2, coupon="c")),
    ]

    rows = decoder.decode(chunk(values)).rows.select(["order_id", "coupon"]).to_pylist()

    assert rows == [{"order_id": 1, "coupon": None}, {"order_id": 2, "coupon": "c"}]


def referenced_files() -> tuple[descriptor_pb2.FileDescriptorProto, ...]:
    """``shop/payment.proto`` imports ``shop/money.proto``, which imports ``shop/currency.proto``."""
    currency = descriptor_pb2.FileDescriptorProto(name="shop/currency.proto", package="shop", syntax="proto3")
    kind = currency.enum_type.add(name="Currency")
    for number, name in enumerate(["EUR", "USD"]):
        kind.value.add(name=name, number=number)
    money = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop", syntax="proto3")
    money.dependency.append("shop/currency.proto")
    amount = money.message_type.add(name="Money")
    amount.field.add(name="currency", number=1, type=F.TYPE_ENUM, type_name=".shop.Currency", label=F.LABEL_OPTIONAL)
    amount.field.add(name="units", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    payment = descriptor_pb2.FileDescriptorProto(name="shop/payment.proto", package="shop", syntax="proto3")
    payment.dependency.append("shop/money.proto")
    message = payment.message_type.add(name="Payment")
    message.field.add(name="payment_id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    message.field.add(name="total", number=2, type=F.TYPE_MESSAGE, type_name=".shop.Money", label=F.LABEL_OPTIONAL)
    return currency, money, payment


def test_imported_files_are_built_from_the_schemas_references_by_their_import_names() -> None:
    currency, money, payment = referenced_files()
    pool = DescriptorPool()
    for file in (currency, money, payment):
        pool.Add(file)
    cls = GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))
    message = cls(payment_id=7)
    message.total.currency = 1
    message.total.units = 12
    # a registry may name a referenced file anything inside its descriptor: the import name counts
    currency.name, money.name = "a.proto", "b.proto"
    money_schema = WriterSchema(
        11, "PROTOBUF", writer(11, money).text, (("shop/currency.proto", writer(10, currency)),)
    )
    paid = WriterSchema(12, "PROTOBUF", writer(12, payment).text, (("shop/money.proto", money_schema),))
    decoder = ProtobufDecoder(message_fields(paid), Registry(paid), "fail")

    rows = decoder.decode(chunk([framed(12, message, indexes=b"\x00")])).rows.to_pylist()

    assert {f.name: f.type for f in message_fields(paid)} == {
        "payment_id": "long",
        "total": "struct<currency: string, units: long>",
    }
    assert rows[0]["total"] == {"currency": "USD", "units": 12}
    unresolved = WriterSchema(12, "PROTOBUF", writer(12, payment).text)
    with pytest.raises(Refused, match=r"imports shop/money\.proto, which the registry holds no reference for"):
        message_fields(unresolved)


def test_a_field_the_writer_renamed_decodes_into_the_tables_column_by_config() -> None:
    fields = [Field(name, kind) for name, kind in [("id", "long"), ("sku", "string"), ("quantity", "int")]]
    line = classes_of_line()
    registry = Registry(writer(1, line_file()))
    decoder = ProtobufDecoder(fields, registry, "fail", {"qty": "quantity"})

    rows = decoder.decode(chunk([framed(1, line(sku="a", qty=4), indexes=b"\x00")])).rows.to_pylist()

    assert rows[0]["quantity"] == 4


def line_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="line.proto", package="shop", syntax="proto3")
    message = file.message_type.add(name="Line")
    message.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    message.field.add(name="sku", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    message.field.add(name="qty", number=3, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    return file


def classes_of_line() -> Any:
    pool = DescriptorPool()
    pool.Add(line_file())
    return GetMessageClass(pool.FindMessageTypeByName("shop.Line"))
