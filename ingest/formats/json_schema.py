"""JSON values in the Confluent wire format, their JSON Schema in the registry (what
confluent-kafka's ``JSONSerializer`` and Kafka Connect's ``JsonSchemaConverter`` write).

The body after the 5-byte prefix is a JSON document: the values of one schema id, stripped of
their prefix, are decoded by the JSON decoder (:mod:`ingest.formats.json`, Arrow's vectorised JSON
reader) against the table's fields, poison records split off with its reasons. The writer's JSON
Schema decides only the table's fields (:func:`object_fields`) and whether its records fit the table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ingest.format_names import FORMAT
from ingest.formats.json import Decoder
from ingest.formats.wire import PREFIX, Parts, Reading, Refused, RegistryDecoder, dependencies, parse_json
from ingest.ports import WriterSchema
from ingest.records import OWN_COLUMNS, ROWS, Field, RawChunk

_STRING_FORMATS = {"date-time": "timestamptz", "date": "date"}
_TYPES = {"integer": "long", "number": "double", "boolean": "boolean"}


class _Mapper:
    """Walks a JSON Schema into table types, resolving ``$ref`` s: local ones (``#/definitions/…``,
    ``#/$defs/…``) and ones into the documents the schema's registry references name
    (``address.json``, ``address.json#/$defs/Street``)."""

    def __init__(self, root: dict[str, Any], documents: dict[str, Any]) -> None:
        self.root = root
        self.documents = documents
        self.open: set[tuple[int, str]] = set()

    def type_of(self, schema: Any, where: str) -> tuple[str, bool]:
        """(the table type, whether null is allowed) of ``schema``."""
        if not isinstance(schema, dict):
            raise Refused(f"{where}: {json.dumps(schema)[:80]} is not a schema with a type")
        if "$ref" in schema:
            return self._reference(schema["$ref"], where)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                branches = [b for b in schema[key] if b != {"type": "null"}]
                if len(branches) != 1:
                    raise Refused(
                        f"{where}: {key} of several types has no Iceberg column type; only null and one type "
                        "(an optional field) map to a column"
                    )
                kind, _ = self.type_of(branches[0], where)
                return kind, len(branches) < len(schema[key])
        declared = schema.get("type")
        types = declared if isinstance(declared, list) else [declared]
        nullable = "null" in types
        others = [t for t in types if t != "null"]
        if len(others) != 1:
            shown = ", ".join(map(str, others)) or "none"
            raise Refused(f"{where}: a field of type(s) {shown} has no Iceberg column type; give it one type")
        kind = str(others[0])
        if kind == "string":
            return _STRING_FORMATS.get(schema.get("format", ""), "string"), nullable
        if kind in _TYPES:
            return _TYPES[kind], nullable
        if kind == "array":
            element, _ = self.type_of(schema.get("items"), f"{where}[]")
            return f"list<{element}>", nullable
        if kind == "object":
            properties = schema.get("properties")
            if not properties:
                raise Refused(
                    f"{where}: an object without properties (a map) cannot be read from JSON values into a column; "
                    "declare its properties"
                )
            inner = ", ".join(f"{name}: {self.type_of(s, f'{where}.{name}')[0]}" for name, s in properties.items())
            return f"struct<{inner}>", nullable
        raise Refused(f"{where}: type {kind!r} has no Iceberg column type")

    def _reference(self, ref: str, where: str) -> tuple[str, bool]:
        document, _, fragment = ref.partition("#")
        root = self.root
        if document:
            if document not in self.documents:
                raise Refused(
                    f"{where}: {ref!r} refers to a document the registry holds no reference for; register the "
                    "schema with its references"
                )
            root = self.documents[document]
        key = (id(root), fragment)
        if key in self.open:
            raise Refused(f"{where}: {ref!r} contains itself; recursive types have no Iceberg form")
        target: Any = root
        for part in filter(None, fragment.split("/")):
            if not isinstance(target, dict) or part not in target:
                raise Refused(f"{where}: {ref!r} is not in the schema")
            target = target[part]
        outer, self.root = self.root, root
        self.open.add(key)
        try:
            return self.type_of(target, where)
        finally:
            self.open.discard(key)
            self.root = outer


def object_fields(text: str, references: Sequence[tuple[str, WriterSchema]] = ()) -> list[Field]:
    """The table fields a JSON Schema of an object maps to (raises :class:`Refused` saying what does
    not): ``integer`` as long, ``number`` as double, ``boolean``, ``string`` (with ``format``
    ``date-time`` as timestamptz and ``date`` as date), objects with properties as structs, arrays as
    lists; a property is required when ``required`` lists it and its type does not allow null.
    ``$ref`` s may name the documents of referenced schemas."""
    root = parse_json(text, "the schema")
    documents = {name: parse_json(d.text, f"referenced schema {name!r}") for name, d in dependencies(references)}
    mapper = _Mapper(root, documents)
    schema: Any = root
    seen: set[str] = set()
    while isinstance(schema, dict) and "$ref" in schema:  # a root that is a reference to the object
        ref = str(schema["$ref"])
        if ref in seen or not ref.startswith("#/"):
            raise Refused(f"the schema's root refers to {ref!r}; a table needs an object with properties")
        seen.add(ref)
        schema = root
        for part in ref[2:].split("/"):
            schema = schema.get(part) if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "object" or not schema.get("properties"):
        raise Refused("the schema is not an object with properties: a table needs named fields")
    required = set(schema.get("required", []))
    fields = []
    for name, property_schema in schema["properties"].items():
        if name in OWN_COLUMNS:
            raise Refused(f"{name}: the pipeline adds a column of that name itself")
        kind, nullable = mapper.type_of(property_schema, name)
        fields.append(Field(name, kind, name in required and not nullable, property_schema.get("description")))
    return fields


class JsonSchemaDecoder(RegistryDecoder):
    """Decodes Confluent-framed JSON values (JSON Schema in the registry) into rows of the table's ``fields``."""

    format = FORMAT["json_schema"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._json = Decoder(self.fields, self.renames)  # JSON names the fields: read old names too

    @staticmethod
    def writer_fields(writer: WriterSchema) -> list[Field]:
        return object_fields(writer.text, writer.references)

    def decode_group(
        self, reading: Reading, values: list[bytes | None], index: Sequence[int], parts: Parts, bad: dict[int, str]
    ) -> None:
        n = len(index)
        positions = pa.array(index, pa.int64())
        bodies: list[bytes | None] = [values[i][PREFIX:] for i in index]  # type: ignore[index]
        chunk = RawChunk(
            topic=pa.array([""] * n, pa.string()),
            partition=pa.array([0] * n, pa.int32()),
            offset=positions,  # the JSON decoder's rows and dead letters say where each value was
            timestamp=pa.nulls(n, pa.timestamp("us", tz="UTC")),
            key=pa.nulls(n, pa.binary()),
            values=bodies,
            headers=lambda i: None,
            nbytes=0,
        )
        decoded = self._json.decode(chunk)
        rows = decoded.rows
        if rows.num_rows:
            parts.append((rows.column(ROWS.offset).to_pylist(), rows.drop_columns(list(ROWS.names))))
        dead = decoded.dead_letters
        for position, error in zip(dead.column("offset").to_pylist(), dead.column("error").to_pylist(), strict=True):
            bad[position] = f"{error} (schema id {reading.schema_id})"
