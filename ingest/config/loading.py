"""Loading a config: a YAML file, ``${ENV_VAR}`` interpolation, paths relative to the file, and
every validation error as a :class:`~ingest.errors.ConfigError` naming the key
(``batch.max_records: ...``) so the user can fix the file without reading code. A file with
``tables:`` is read as one config per table."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from ingest.config.keys import ROUTE_KEYS, TABLE_KEYS
from ingest.config.model import PipelineConfig
from ingest.config.sections import NO_TOPICS, TopicPattern
from ingest.errors import ConfigError

ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


@functools.cache
def schema_file_text(path: str) -> str:
    """The Avro schema file ``schema_file:`` names, read once per process (the driver reads it and
    hands the text to its tasks, so a file edited during a run changes nothing until the next)."""
    try:
        return Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read schema_file {path}: {error.strerror}") from None


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Replace ``${NAME}`` and ``${NAME:-default}``; an unset variable without default is an error."""
    env = dict(os.environ) if env is None else env
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        name, default = match.group("name"), match.group("default")
        if name in env:
            return env[name]
        if default is not None:
            return default
        missing.append(name)
        return ""

    result = ENV_REF.sub(sub, text)
    if missing:
        raise ConfigError(f"environment variable(s) {', '.join(sorted(set(missing)))} referenced but not set")
    return result


def _interpolate_values(data: Any, env: dict[str, str] | None, where: str = "") -> Any:
    """Interpolate inside string values only (never keys or comments); an error names the key."""
    if isinstance(data, str):
        try:
            return interpolate(data, env)
        except ConfigError as error:
            raise ConfigError(f"{where or 'the config'}: {error}") from None
    if isinstance(data, dict):
        return {k: _interpolate_values(v, env, f"{where}.{k}" if where else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_interpolate_values(v, env, f"{where}.{i}") for i, v in enumerate(data)]
    return data


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Relative warehouse, SQLite and schema file paths are relative to the config file's directory."""
    topics = data.get("topics")
    pattern = data.get("topics_pattern")
    for topic in [*(topics if isinstance(topics, list) else []), pattern]:
        if isinstance(topic, dict) and isinstance(topic.get("schema_file"), str):
            topic["schema_file"] = str((base / topic["schema_file"]).resolve())
    catalog = data.get("catalog")
    if not isinstance(catalog, dict):
        return
    warehouse = catalog.get("warehouse")
    if isinstance(warehouse, str) and "://" not in warehouse:
        catalog["warehouse"] = (base / warehouse).resolve().as_uri()
    uri = catalog.get("uri")
    prefix = "sqlite:///"
    if isinstance(uri, str) and uri.startswith(prefix) and not uri.startswith((prefix + "/", prefix + ":memory:")):
        catalog["uri"] = prefix + str((base / uri[len(prefix) :]).resolve())


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """A validation error's place in the config as people find it: ``schema[1] 'amount'.type``, an
    entry of a list named by its ``name`` (the field, the topic) besides its index."""
    where = ""
    for step in loc:
        if isinstance(step, int):
            where += f"[{step}]"
            data = data[step] if isinstance(data, list) and step < len(data) else None
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                where += f" {data['name']!r}"
        else:
            where += f".{step}" if where else str(step)
            data = data.get(step) if isinstance(data, dict) else None
    return where


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """``; did you mean `partition_by`?`` for a misspelt key, from the keys valid where it is."""
    from ingest.config.json_schema import keys_at

    close = difflib.get_close_matches(str(loc[-1]), keys_at(loc[:-1]), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def _format(error: ValidationError, data: Any) -> str:
    lines = []
    for item in error.errors():
        where = _where(data, item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"unknown key{_did_you_mean(item['loc'])} (`ingest config-schema` lists every key)"
        elif item["type"] == "missing":
            message = "required key is missing"
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    if isinstance(data, dict) and not {"topics", "topics_pattern"} & set(data):
        # the check that names it runs only once every key is valid; other keys' errors come first
        lines.append(f"  topics: {NO_TOPICS}")
    return "\n".join(dict.fromkeys(lines))


def parse(data: Any, source: str = "<config>", table: str | None = None) -> PipelineConfig:
    """The config of one table: the config's only one, or (``tables:``) the entry for ``table``."""
    return chosen(parse_routes(data, source), source, table)


#: how a caller of :func:`chosen` names a table: ``ingest``'s option (the Python API says ``table=``)
BY_OPTION = "--table (`ingest run`, `status`, `history`, `verify`, `check` and `maintain` take them all without it)"


def chosen(routes: Sequence[PipelineConfig], source: str, table: str | None, how: str = BY_OPTION) -> PipelineConfig:
    """The route of ``table`` (``--table``), or the only one; ``how`` a caller names one, for the
    error when there are several."""
    if table is not None:
        for route in routes:
            if route.table == table:
                return route
        raise ConfigError(f"{source} has no table {table!r}; its tables: {', '.join(r.table for r in routes)}")
    if len(routes) > 1:
        raise ConfigError(
            f"{source} routes to {len(routes)} tables ({', '.join(r.table for r in routes)}): name one with {how}"
        )
    return routes[0]


def parse_routes(data: Any, source: str = "<config>") -> list[PipelineConfig]:
    """Every table's config: one, or one per entry of ``tables:`` (each entry's keys over the shared ones)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    if "tables" not in data:
        try:
            return [PipelineConfig.model_validate(data)]
        except ValidationError as error:
            raise ConfigError(f"{source} is invalid:\n{_format(error, data)}") from None
    if "route_by" in data:
        raise ConfigError(
            f"{source} is invalid:\n  route_by: a field's value picks the table among the tables route_by.table "
            "names, so it goes with `topics:` (or `topics_pattern:`) and no `tables:`; run the routed topics as a "
            "pipeline of their own"
        )
    entries, shared = data["tables"], {k: v for k, v in data.items() if k != "tables"}
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source} is invalid:\n  tables: a list of tables, each with `table:` and its topics")
    lines = [
        f"  {key}: with `tables:`, each entry names its table and topics; move it into the entries"
        for key in sorted(ROUTE_KEYS & set(shared))
    ]
    routes: list[PipelineConfig] = []
    for i, entry in enumerate(entries):
        where = f"tables[{i}]" + (f" {entry['table']!r}" if isinstance(entry, dict) and "table" in entry else "")
        if not isinstance(entry, dict):
            lines.append(f"  {where}: expected a mapping (table:, topics: or topics_pattern:, schema:, ...)")
            continue
        lines += [
            f"  {where}.{key}: not a key of a table (the pipeline's keys, such as kafka: and batch:, are given once, "
            "at the top level)"
            for key in sorted(set(entry) - TABLE_KEYS)
        ]
        merged = {**{k: v for k, v in shared.items() if k not in ROUTE_KEYS}, **entry}
        try:
            routes.append(PipelineConfig.model_validate(merged))
        except ValidationError as error:
            lines += [f"  {where}.{line.strip()}" for line in _format(error, merged).splitlines()]
    lines += _across(routes)
    if lines:
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(dict.fromkeys(lines)))
    return _routed(routes)


def _across(routes: Sequence[PipelineConfig]) -> list[str]:
    """What the entries of ``tables:`` must not share: a table, a listed topic."""
    lines = []
    # compared as catalogs that fold case (Glue, Hive) name them: two spellings are one table there
    tables = [r.table.lower() for r in routes]
    for name in sorted({t for t in tables if tables.count(t) > 1}):
        lines.append(f"  tables: {name!r} is listed twice")
    dead = [r.dead_letters.lower() for r in routes]
    for name in sorted({t for t in dead if dead.count(t) > 1 or t in tables}):
        lines.append(
            f"  tables: {name!r} is the dead-letter table of an entry and another table of the config; "
            "set dead_letter_table"
        )
    listed = [t for r in routes for t in r.topics]
    for topic in sorted({t for t in listed if listed.count(t) > 1}):
        lines.append(f"  tables: topic {topic!r} is listed by two entries; a topic feeds one table")
    if len(routes) > 1 and any(r.metrics is not None and r.metrics.port is not None for r in routes):
        lines.append(
            "  metrics.port: serving /metrics is for a config of one table for now; with `tables:` use textfile "
            "(one file per table) or pushgateway (one group per table)"
        )
    return lines


def _routed(routes: list[PipelineConfig]) -> list[PipelineConfig]:
    """The entries of ``tables:`` side by side: each pattern leaving alone what the other entries
    take, each table's metrics its own."""
    listed = frozenset(t for r in routes for t in r.topics)
    earlier: list[TopicPattern] = []
    claimed = []
    for route in routes:
        pattern = route.topics_pattern
        if pattern is not None:
            routed = pattern.beside(listed, tuple(earlier))
            route = route.model_copy(update={"topics_pattern": routed})
            earlier.append(routed)
        if route.metrics is not None:
            route = route.model_copy(update={"metrics": route.metrics.of_table(route.table)})
        else:
            route = route.model_copy()
        route._siblings = tuple(other.table for other in routes if other.table != route.table)
        claimed.append(route)
    return claimed


def load(path: str | Path, env: dict[str, str] | None = None, table: str | None = None) -> PipelineConfig:
    """The config of one table (see :func:`parse`)."""
    return chosen(load_routes(path, env), str(path), table)


def load_routes(path: str | Path, env: dict[str, str] | None = None) -> list[PipelineConfig]:
    """Every table's config in the file (see :func:`parse_routes`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - raw.rfind(b"\n", 0, error.start)
        raise ConfigError(
            f"{path} is not UTF-8 text: byte 0x{raw[error.start]:02x} at offset {error.start} (line {line}, column "
            f"{column}) is not valid UTF-8. Save the file as UTF-8 (YAML's encoding)."
        ) from None
    try:
        data = _interpolate_values(yaml.safe_load(text), env)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML{_located(error, path)}") from None
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    if isinstance(data, dict):
        _resolve_paths(data, path.resolve().parent)
        entries = data.get("tables")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                _resolve_paths(entry, path.resolve().parent)
    return parse_routes(data, str(path))


def _located(error: yaml.YAMLError, path: Path) -> str:
    """PyYAML's message after where the problem is (line and column, 1-based), naming the file it read
    (it names the string it was given)."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return f": {error}"
    for mark in (error.context_mark, error.problem_mark):
        if mark is not None:
            mark.name = str(path)
    mark = error.problem_mark or error.context_mark
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{where}: {error}"
