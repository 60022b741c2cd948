"""What Arrow's JSON reader takes into a field of each type: what it parses the field's values as
(:func:`parse_type`, before the checked cast to the field's type), and the JSON kinds it takes there
whatever the value (:class:`Kind`), by which a chunk's poison is named without asking Arrow about
each record."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from ingest.type_names import type_name


def parse_type(target: pa.DataType) -> pa.DataType:
    """What Arrow's JSON reader parses a field of ``target`` type as, before the final (checked)
    cast; nested types field by field."""
    if pa.types.is_date(target):
        return pa.string()
    if pa.types.is_float32(target):
        return pa.float64()
    if pa.types.is_decimal(target):
        # the reader checks precision before rescaling; parse wide, then cast with checks
        return pa.decimal128(38, target.scale)
    if pa.types.is_struct(target):
        return pa.struct([field.with_type(parse_type(field.type)) for field in target])
    if pa.types.is_list(target):
        return pa.list_(target.value_field.with_type(parse_type(target.value_type)))
    return target


def nested(target: pa.DataType) -> bool:
    return bool(pa.types.is_struct(target) or pa.types.is_list(target))


#: a parsed JSON value's Python type, as messages name its JSON kind
JSON_KINDS = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object", list: "array"}


def accepts(target: pa.DataType) -> tuple[type, ...] | None:
    """The Python types (of a parsed JSON value) Arrow's reader can take into a field of ``target``;
    any other kind it refuses whatever the value. None: not judged by kind (Arrow decides). Pinned
    against Arrow itself by tests/unit/test_decode.py."""
    if pa.types.is_boolean(target):
        return (bool,)
    if pa.types.is_integer(target) or pa.types.is_time(target):
        return (int,)
    if pa.types.is_floating(target):
        return (int, float)
    if pa.types.is_decimal(target):
        return (int, float, str)
    if (
        pa.types.is_string(target)
        or pa.types.is_binary(target)
        or pa.types.is_date(target)
        or pa.types.is_timestamp(target)
    ):
        return (str,)
    if pa.types.is_struct(target):
        return (dict,)
    if pa.types.is_list(target):
        return (list,)
    return None


@dataclass(frozen=True)
class Kind:
    """What a field's parsed JSON values must be for Arrow's reader to take them (built once per
    field from its type, checked per record when a chunk holds poison)."""

    accepted: tuple[type, ...]
    type_name: str
    children: tuple[tuple[str, Kind], ...] = ()  # a struct's fields that are judged by kind
    item: Kind | None = None  # a list's items, if they are

    @classmethod
    def of(cls, target: pa.DataType) -> Kind | None:
        accepted = accepts(target)
        if accepted is None:
            return None
        if pa.types.is_struct(target):
            children = tuple((f.name, kind) for f in target if (kind := cls.of(f.type)) is not None)
            return cls(accepted, type_name(target), children=children)
        if pa.types.is_list(target):
            return cls(accepted, type_name(target), item=cls.of(target.value_type))
        return cls(accepted, type_name(target))

    def error(self, value: object, path: str) -> str | None:
        """Why Arrow refuses ``value`` at ``path`` by its kind alone, nested fields included; None if
        the kinds fit (the value itself may still be refused)."""
        if type(value) not in self.accepted:  # exact: a JSON true is a bool, never an int
            if value is None:
                return None
            got = json.dumps(value)[:80]
            if type(value) is float and int in self.accepted:
                return f"field {path!r}: cannot convert {got} to {self.type_name}: not an integer"
            return f"field {path!r}: expected {self.type_name}, got a JSON {JSON_KINDS.get(type(value), 'value')} {got}"
        if self.children and isinstance(value, dict):
            for name, child in self.children:
                inner = value.get(name)
                if inner is not None and (error := child.error(inner, f"{path}.{name}")):
                    return error
        elif self.item is not None and isinstance(value, list):
            for i, item in enumerate(value):
                if error := self.item.error(item, f"{path}[{i}]"):
                    return error
        return None
