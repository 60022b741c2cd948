"""The configuration reference as Markdown, rendered from the config's JSON Schema
(:func:`ingest.config.json_schema.config_schema`): every key with its type, default and meaning.
``ingest config-schema --markdown`` prints it; the docs site's reference page is its output."""

from __future__ import annotations

import json
from typing import Any

from ingest.config.json_schema import ENV_VALUE, config_schema


def reference_markdown() -> str:
    schema = config_schema()
    definitions = schema["$defs"]
    lines = [
        "# Configuration reference",
        "",
        "Every key of a pipeline config, generated from the config model (`ingest config-schema --markdown`",
        "prints this page; `ingest config-schema` the JSON Schema editors check a config with). Wherever a",
        "number or a boolean goes, `${NAME}` or `${NAME:-default}` takes it from the environment.",
        "",
        "## Top-level keys",
        "",
        *_table(schema["properties"], {*schema["required"], "table"}),
        "",
        "A config names its table with `table:`, or several with `tables:` (each entry takes the keys "
        f"{_keys(schema['properties']['tables']['items']['properties'])}: the keys of a table), or lets a "
        "field's value pick it with `route_by:`.",
    ]
    for key, name in _sections(schema["properties"]):
        definition = definitions[name]
        lines += [
            "",
            f"## `{key}:`",
            "",
            definition.get("description", ""),
            "",
            *_table(definition["properties"], set(definition.get("required", []))),
        ]
    return "\n".join(line.rstrip() for line in lines).strip() + "\n"


def _sections(properties: dict[str, Any]) -> list[tuple[str, str]]:
    """The top-level keys whose value is an object of its own (or a list of them, or one among
    alternatives), with the name of its definition, in the order of the keys."""
    return [(key, ref.rsplit("/", 1)[-1]) for key, prop in properties.items() if (ref := _ref(prop))]


def _ref(node: dict[str, Any]) -> str | None:
    """The definition ``node`` refers to, itself, as its items or as one of its alternatives (never
    through its properties: an object written out in place is no section)."""
    if "$ref" in node:
        return str(node["$ref"])
    for option in [*([node["items"]] if "items" in node else []), *node.get("anyOf", [])]:
        found = _ref(option)
        if found:
            return found
    return None


def _keys(properties: dict[str, Any]) -> str:
    return ", ".join(f"`{name}`" for name in properties)


def _table(properties: dict[str, Any], required: set[str]) -> list[str]:
    rows = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for name, prop in properties.items():
        default = "required" if name in required else _default(prop)
        description = prop.get("description", "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(prop)} | {default} | {description} |")
    return rows


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, dict):
        return "see below"
    return f"`{json.dumps(value)}`"


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return "object (below)"
    if "anyOf" in prop:
        kinds = [_type(p) for p in prop["anyOf"] if p != ENV_VALUE and p.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    if "enum" in prop:
        return " \\| ".join(f"`{value}`" for value in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"map of {_type(values)}" if isinstance(values, dict) else "object"
    if prop.get("format") == "date-time":
        return "timestamp"
    return {"string": "text", "integer": "integer", "number": "number", "boolean": "boolean"}.get(kind or "", "any")
