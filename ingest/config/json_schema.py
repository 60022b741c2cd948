"""The JSON Schema (draft 2020-12) of a pipeline config file, derived from the config model: its
keys' types, defaults, enums and descriptions (:mod:`ingest.config.keys`), a file of several tables
(``tables:``), and ``${VAR}`` wherever a number or a boolean goes, as the loader interpolates it.
``ingest config-schema`` prints it; editors that read ``# yaml-language-server: $schema=…`` complete
and check a config with it."""

from __future__ import annotations

import re
from typing import Any

from ingest.config.keys import ROUTE_KEYS, TABLE_KEYS
from ingest.config.model import PipelineConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: a value the loader replaces with an environment variable's (``${NAME}`` or ``${NAME:-default}``)
ENV_VALUE = {"type": "string", "pattern": r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"}
SCALARS = ("integer", "number", "boolean")


def config_schema() -> dict[str, Any]:
    model = PipelineConfig.model_json_schema(by_alias=True, mode="validation")
    definitions = {name: _tidied(schema) for name, schema in model.pop("$defs", {}).items()}
    properties = {name: _tidied(schema) for name, schema in model["properties"].items()}
    table_keys = {name: properties[name] for name in sorted(TABLE_KEYS | {"dead_letter_table"}) if name in properties}
    properties["tables"] = {
        "description": "several tables in one file: each entry names its table and the topics that feed it, with its "
        "own keys of a table; the keys outside `tables:` are every table's (a table's key there is every entry's "
        "default)",
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "properties": table_keys,
            "required": ["table"],
            "additionalProperties": False,
        },
    }
    return {
        "$schema": DIALECT,
        "title": "lakehouse-ingest pipeline",
        "description": "A pipeline: Kafka topics read in batches into Iceberg tables, exactly once.",
        "type": "object",
        "properties": properties,
        "required": [name for name in model.get("required", []) if name not in ROUTE_KEYS],
        # one table (`table:`), several (`tables:`), or the tables a field's value picks (`route_by:`)
        "anyOf": [{"required": ["table"]}, {"required": ["tables"]}, {"required": ["route_by"]}],
        "additionalProperties": False,
        "$defs": definitions,
    }


def _tidied(schema: Any) -> Any:
    """``schema`` with descriptions as Markdown on one line, pydantic's titles left out (editors
    show the key), and ``${VAR}`` taken wherever a number or a boolean goes."""
    if isinstance(schema, list):
        return [_tidied(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    tidy = {key: _tidied(value) for key, value in schema.items() if key != "title" or not isinstance(value, str)}
    if isinstance(tidy.get("description"), str):
        tidy["description"] = re.sub(r"\s+", " ", re.sub(r"``(.+?)``", r"`\1`", tidy["description"])).strip()
    if tidy.get("type") in SCALARS:
        annotations = {key: tidy.pop(key) for key in ("default", "description") if key in tidy}
        return {"anyOf": [tidy, ENV_VALUE], **annotations}
    return tidy


def keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys valid at ``loc`` in a config (``()``: the top level; ``("batch",)``; ``("topics", 0)``)."""
    schema = config_schema()
    node: Any = schema
    for step in loc:
        node = _object_of(node, schema["$defs"])
        if node is None:
            return []
        node = node.get("items") if isinstance(step, int) else node.get("properties", {}).get(step)
        if node is None:
            return []
    found = _object_of(node, schema["$defs"])
    return list(found.get("properties", {})) if found is not None else []


def _object_of(node: Any, definitions: dict[str, Any]) -> dict[str, Any] | None:
    """``node`` itself, or the definition or the object (or list) among the alternatives it refers to."""
    if not isinstance(node, dict):
        return None
    if "$ref" in node:
        return _object_of(definitions[node["$ref"].rsplit("/", 1)[-1]], definitions)
    for option in node.get("anyOf", []):
        found = _object_of(option, definitions)
        if found is not None and ("properties" in found or "items" in found):
            return found
    return node
