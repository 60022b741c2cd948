"""Pipeline configuration: a YAML file validated by pydantic, with ``${ENV_VAR}`` interpolation.

The sections of a config are in :mod:`~ingest.config.sections`, its keys with their descriptions
in :mod:`~ingest.config.keys`, the whole config of one table (:class:`PipelineConfig`, the checks
across its keys) in :mod:`~ingest.config.model`, reading it from a file in
:mod:`~ingest.config.loading`, and its JSON Schema and Markdown reference in
:mod:`~ingest.config.json_schema` and :mod:`~ingest.config.reference`. The names below are the
package's interface; code imports them from ``ingest.config``.
"""

from ingest.config.loading import chosen, interpolate, load, load_routes, parse, parse_routes, schema_file_text
from ingest.config.model import PipelineConfig
from ingest.config.sections import (
    NO_TOPICS,
    ORPHAN_AGE_FLOOR_HOURS,
    ROUTE_TYPES,
    ROUTE_VALUE,
    ROUTE_VALUE_CHARS,
    TABLE_ID,
    BatchSpec,
    CommitSpec,
    DeadLetterSpec,
    FieldSpec,
    MaintenanceSpec,
    MetricsSpec,
    RouteBySpec,
    TopicPattern,
    TopicSource,
    TopicSpec,
)

__all__ = [
    "NO_TOPICS",
    "ORPHAN_AGE_FLOOR_HOURS",
    "ROUTE_TYPES",
    "ROUTE_VALUE",
    "ROUTE_VALUE_CHARS",
    "TABLE_ID",
    "BatchSpec",
    "CommitSpec",
    "DeadLetterSpec",
    "FieldSpec",
    "MaintenanceSpec",
    "MetricsSpec",
    "PipelineConfig",
    "RouteBySpec",
    "TopicPattern",
    "TopicSource",
    "TopicSpec",
    "chosen",
    "interpolate",
    "load",
    "load_routes",
    "parse",
    "parse_routes",
    "schema_file_text",
]
