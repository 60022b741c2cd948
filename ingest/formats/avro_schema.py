"""Avro writer schemas as the table's fields: a schema (with the named types of the schemas it
refers to) resolved into a tree of :class:`Node` s, what decoding and conforming need, and the
table fields a record schema maps to (:func:`record_fields`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ingest.formats.wire import Refused, dependencies, parse_json
from ingest.ports import WriterSchema
from ingest.records import OWN_COLUMNS, Field, renaming

#: Avro's primitives, as the table's types
_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}
_LOGICAL = {
    "date": "date",
    "time-millis": "time",
    "time-micros": "time",
    "timestamp-millis": "timestamptz",
    "timestamp-micros": "timestamptz",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "uuid": "string",
}


@dataclass
class Node:
    """A writer schema's type with named references resolved: what decoding and conforming need."""

    kind: str  # a primitive's table type, or record | array | map | enum
    optional: bool = False
    fields: list[tuple[str, Node]] = field(default_factory=list)  # record
    items: Node | None = None  # array elements, map values
    symbols: list[str] = field(default_factory=list)  # enum
    decimal: tuple[int, int] | None = None
    #: the Avro schema polars decodes this type with (enums as their index, maps as key/value arrays)
    avro: Any = None

    def type_name(self) -> str:
        if self.kind == "record":
            return "struct<" + ", ".join(f"{name}: {node.type_name()}" for name, node in self.fields) + ">"
        if self.kind == "array":
            assert self.items is not None
            return f"list<{self.items.type_name()}>"
        if self.kind == "map":
            assert self.items is not None
            return f"map<string, {self.items.type_name()}>"
        if self.kind == "enum":
            return "string"
        if self.decimal is not None:
            return f"decimal({self.decimal[0]},{self.decimal[1]})"
        return self.kind

    def renamed(self, renames: Mapping[str, str]) -> Node:
        """A record's top-level fields under the table's names (Avro's encoding has no names: the
        values are read as they are)."""
        if not renames:
            return self
        apply = renaming([name for name, _ in self.fields], renames)
        return replace(self, fields=[(apply.get(name, name), child) for name, child in self.fields])


class _Resolver:
    """Walks an Avro schema (JSON) into :class:`Node` s, resolving named types."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.open: set[str] = set()  # records being resolved (a reference to one is recursion)
        self.count = 0

    def _fresh(self, prefix: str) -> str:
        self.count += 1
        return f"__{prefix}{self.count}"

    def node(self, schema: Any, where: str, namespace: str = "") -> Node:
        if isinstance(schema, list):
            return self._union(schema, where, namespace)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return Node(_PRIMITIVES[schema], avro=schema)
            if schema == "null":
                raise Refused(f"{where}: a field that is always null has no Iceberg type")
            return self._reference(schema, where, namespace)
        if not isinstance(schema, dict) or "type" not in schema:
            raise Refused(f"{where}: {json.dumps(schema)[:80]} is not an Avro schema")
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if not 1 <= precision <= 38:
                raise Refused(f"{where}: decimal precision {precision} is beyond Iceberg's 38 digits")
            self._name(schema, namespace)
            return Node(
                "decimal",
                decimal=(precision, scale),
                avro={**schema, "name": self._fresh("d")} if kind == "fixed" else schema,
            )
        if isinstance(kind, str) and logical in _LOGICAL and kind in ("int", "long", "string"):
            return Node(_LOGICAL[logical], avro=schema)
        if kind == "record":
            return self._record(schema, where, namespace)
        if kind == "enum":
            self._name(schema, namespace)
            return Node("enum", symbols=list(schema["symbols"]), avro="int")
        if kind == "fixed":
            self._name(schema, namespace)
            return Node("binary", avro={"type": "fixed", "name": self._fresh("f"), "size": schema["size"]})
        if kind == "array":
            items = self.node(schema["items"], f"{where}[]", namespace)
            return Node("array", items=items, avro={"type": "array", "items": items.avro})
        if kind == "map":
            values = self.node(schema["values"], f"{where}{{}}", namespace)
            entry = {
                "type": "record",
                "name": self._fresh("m"),
                "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": values.avro}],
            }
            return Node("map", items=values, avro={"type": "array", "items": entry})
        return self.node(kind, where, namespace)  # {"type": "string"} and the like

    def _name(self, schema: dict[str, Any], namespace: str) -> str:
        name = str(schema.get("name", ""))
        space = schema.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        self.named[full] = schema
        return full

    def _reference(self, name: str, where: str, namespace: str) -> Node:
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        schema = self.named.get(full, self.named.get(name))
        if schema is None:
            raise Refused(f"{where}: unknown type {name!r}")
        if full in self.open or name in self.open:
            raise Refused(f"{where}: record {name!r} contains itself; recursive types have no Iceberg form")
        return self.node(schema, where, namespace)

    def _union(self, branches: list[Any], where: str, namespace: str) -> Node:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            shown = ", ".join(b if isinstance(b, str) else str(b.get("type")) for b in others)
            raise Refused(
                f"{where}: a union of several types ({shown}) has no Iceberg column type; only a union of null "
                "and one type (an optional field) maps to a column"
            )
        node = self.node(others[0], where, namespace)
        node.optional = len(branches) > 1
        node.avro = [b if b == "null" else node.avro for b in branches]
        return node

    def _record(self, schema: dict[str, Any], where: str, namespace: str) -> Node:
        full = self._name(schema, namespace)
        space = full.rpartition(".")[0]
        self.open.add(full)
        fields: list[tuple[str, Node]] = []
        for item in schema.get("fields", []):
            name = item["name"]
            fields.append((name, self.node(item["type"], f"{where}.{name}" if where else name, space)))
        self.open.discard(full)
        avro = {
            "type": "record",
            "name": self._fresh("r"),
            "fields": [{"name": name, "type": node.avro} for name, node in fields],
        }
        return Node("record", fields=fields, avro=avro)


def resolve(text: str, references: Sequence[tuple[str, WriterSchema]] = ()) -> Node:
    """The record ``text`` declares, its named types looked up in the schemas it refers to too
    (an Avro reference names a schema of another subject that defines them)."""
    resolver = _Resolver()
    for name, referenced in dependencies(references):
        resolver.node(parse_json(referenced.text, f"referenced schema {name!r}"), name)
    node = resolver.node(parse_json(text, "the schema"), "")
    if node.kind != "record" or node.optional:
        raise Refused(f"the schema is a {node.type_name()}, not a record: a table needs named fields")
    return node


def record_fields(text: str, references: Sequence[tuple[str, WriterSchema]] = ()) -> list[Field]:
    """The table fields an Avro record schema maps to (raises :class:`Refused` saying what does not
    map): primitives as themselves (``bytes`` and ``fixed`` as binary), logical types as Iceberg's
    (decimal, date, time, timestamp(tz), uuid as string), a union with null as an optional field,
    records as structs, arrays as lists, maps as ``map<string, …>``, enums as strings. Named types
    may come from referenced schemas."""
    node = resolve(text, references)
    for name, _ in node.fields:
        if name in OWN_COLUMNS:
            raise Refused(f"{name}: the pipeline adds a column of that name itself")
    return [Field(name, child.type_name(), not child.optional) for name, child in node.fields]
