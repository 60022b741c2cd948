"""A pipeline's config (:class:`PipelineConfig`): one table, its topics and every section, checked
across sections as a run needs them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import (
    PrivateAttr,
    field_validator,
    model_validator,
)

from ingest.config.keys import PipelineKeys
from ingest.config.sections import (
    NO_TOPICS,
    ROUTE_TYPES,
    TABLE_ID,
    TopicPattern,
    TopicSource,
    TopicSpec,
    has_map,
)
from ingest.core.ledger_codec import PIPELINE_TABLE_PROPERTIES
from ingest.format_names import REGISTRY_FORMATS
from ingest.records import KAFKA_COLUMNS, KEY_COLUMN, OWN_COLUMNS, parse_sort, parse_transform
from ingest.type_names import arrow_type

PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
SECRET_WORDS = ("password", "secret", "token", "credential", "sasl.jaas", "user.info")


class PipelineConfig(PipelineKeys):
    """A pipeline's config: its keys (:class:`~ingest.config.keys.PipelineKeys`), checked across sections."""

    _siblings: tuple[str, ...] = PrivateAttr(default=())
    """with ``tables:``, the other entries' tables: a topic new to this table's ledger that one of them has read is not
    read again here from the start (see :meth:`ingest.pipeline.Pipeline.plan`)
    """

    @property
    def siblings(self) -> tuple[str, ...]:
        return self._siblings

    @model_validator(mode="before")
    @classmethod
    def _routed_tables(cls, data: Any) -> Any:
        """With ``route_by:``, ``table`` is the ledger's table and the dead letters go beside it."""
        if not isinstance(data, dict) or not isinstance(data.get("route_by"), dict):
            return data
        route, pipeline = data["route_by"], data.get("pipeline")
        if "table" in data:
            raise ValueError(
                "table: with `route_by:`, each record's table is route_by.table with its value filled in; leave "
                "`table:` out (the ledger's table is route_by.ledger_table)"
            )
        template = route.get("table")
        namespace = template.rpartition(".")[0] if isinstance(template, str) else ""
        if not namespace or not isinstance(pipeline, str):
            return data  # the errors of those keys say what is wrong
        return {
            "dead_letter_table": f"{namespace}.{pipeline.replace('-', '_')}_dead_letter",
            **data,
            "table": route.get("ledger_table") or f"{namespace}.{pipeline.replace('-', '_')}_ledger",
        }

    @field_validator("topic_specs", mode="before", json_schema_input_type=list[str | TopicSpec])
    @classmethod
    def _plain_names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("topics_pattern", mode="before", json_schema_input_type=str | TopicPattern | None)
    @classmethod
    def _plain_pattern(cls, value: Any) -> Any:
        return {"pattern": value} if isinstance(value, str) else value

    @field_validator("schema_registry")
    @classmethod
    def _registry_url(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and "url" not in value:
            raise ValueError("needs 'url' (the rest are confluent-kafka SchemaRegistryClient properties)")
        return value

    @field_validator("pipeline")
    @classmethod
    def _pipeline_id(cls, value: str) -> str:
        if not PIPELINE_ID.match(value):
            raise ValueError(
                "must be a stable id of letters, digits, '_' and '-' (it scopes the ledger keys "
                "'ingest.<pipeline>.*'), never a run id or host name"
            )
        return value

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, value: Any) -> Any:
        if value in ("earliest", "latest"):
            return value
        moment = value
        if isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                moment = None
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise ValueError(
                f"{value!r} is not a start position: use 'earliest', 'latest', or an ISO-8601 timestamp "
                "with a time zone such as 2026-12-01T00:00:00Z (the first offsets at or after it)"
            )
        return moment

    @field_validator("table", "dead_letter_table")
    @classmethod
    def _table_id(cls, value: str | None) -> str | None:
        if value is not None and not TABLE_ID.fullmatch(value):
            raise ValueError("must be 'namespace.table'")
        return value

    @field_validator("kafka")
    @classmethod
    def _bootstrap(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "bootstrap.servers" not in value:
            raise ValueError("needs 'bootstrap.servers' (librdkafka properties are passed through)")
        for managed in ("enable.auto.commit", "auto.offset.reset", "isolation.level"):
            if managed in value:
                raise ValueError(f"{managed!r} is set by the pipeline for exactly-once reads; remove it")
        return value

    @field_validator(
        "catalog", "table_properties", mode="before", json_schema_input_type=dict[str, str | int | float | bool]
    )
    @classmethod
    def _catalog_scalars(cls, value: Any) -> Any:
        """``port: 5432`` as pyiceberg wants it, a string: catalog and table properties are strings."""
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v
                    for k, v in value.items()}  # fmt: skip
        return value

    @field_validator("catalog")
    @classmethod
    def _catalog(cls, value: dict[str, str]) -> dict[str, str]:
        if "name" not in value:
            raise ValueError("needs 'name' (the rest are pyiceberg catalog properties)")
        return value

    @field_validator("table_properties")
    @classmethod
    def _table_properties(cls, value: dict[str, str]) -> dict[str, str]:
        owned = sorted(set(value) & set(PIPELINE_TABLE_PROPERTIES))
        if owned:
            raise ValueError(f"{', '.join(owned)}: set by the pipeline on the tables it creates; leave it out")
        return value

    @field_validator("sort_by")
    @classmethod
    def _sort_keys(cls, value: list[str]) -> list[str]:
        for item in value:
            if parse_sort(item) is None:
                raise ValueError(f"{item!r} is not a sort key; use col, 'col asc' or 'col desc' (a top-level column)")
        return value

    @field_validator("partition_by")
    @classmethod
    def _transforms(cls, value: list[str]) -> list[str]:
        for item in value:
            if parse_transform(item) is None:
                raise ValueError(
                    f"{item!r} is not a partition transform; use col, identity(col), year(col), month(col), "
                    "day(col), hour(col), bucket(N, col) or truncate(W, col)"
                )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        if self.topic_specs and self.topics_pattern is not None:
            raise ValueError("topics_pattern: give the topics to read as `topics:` or as `topics_pattern:`, not both")
        if not self.topic_specs and self.topics_pattern is None:
            given = "topic_specs" in self.model_fields_set
            raise ValueError(f"topics: {'needs at least one topic' if given else NO_TOPICS}")
        topics = [t.name for t in self.topic_specs]
        if len(set(topics)) != len(topics):
            raise ValueError(f"topics: a topic is listed twice: {sorted({t for t in topics if topics.count(t) > 1})}")
        formats = {t.format for t in self.sources}
        if len(formats) > 1:
            raise ValueError(
                f"topics: one pipeline reads one value format for now, got {sorted(formats)}; run a pipeline per format"
            )
        files = {t.schema_file for t in self.sources}
        if len(files) > 1:
            raise ValueError("topics: every topic of a pipeline has the same schema_file, or none has one")
        key_formats = {t.key_format for t in self.sources}
        if len(key_formats) > 1:
            shown = sorted(str(k) for k in key_formats)
            raise ValueError(f"topics: every topic of a pipeline has the same key_format, or none has one; got {shown}")
        registry = formats <= set(REGISTRY_FORMATS) and self.schema_file is None
        if registry and self.schema_registry is None:
            raise ValueError(f"topics: format {self.format!r} needs `schema_registry:` (at least its url)")
        if self.key_format in REGISTRY_FORMATS and self.schema_registry is None:
            raise ValueError(f"topics: key_format {self.key_format!r} needs `schema_registry:` (at least its url)")
        if self.schema_ is None:
            if not registry and self.schema_file is None:
                raise ValueError("schema: required key is missing (JSON topics have no schema of their own)")
            return self._common_checks([])
        text_only = sorted(set(self.refuse) - {"nan"})
        if text_only and self.format != "json":
            raise ValueError(
                f"refuse: {', '.join(text_only)} is for JSON values, whose timestamps are text; {self.format} "
                "values carry typed timestamps"
            )
        if self.unknown_fields != "drop" and self.format != "json":
            raise ValueError(
                f"unknown_fields: {self.unknown_fields} is for JSON values; {self.format} values have a writer schema, "
                "and the table evolves to take its fields (on_schema_change)"
            )
        for field in self.schema_ if self.format == "json" else []:
            if has_map(arrow_type(field.type)):
                raise ValueError(
                    f"schema: field {field.name!r}: map types cannot be read from JSON values (Arrow's JSON reader "
                    "reads objects only into a struct<…> of known fields); declare a struct<…> of the keys you expect"
                )
        return self._common_checks([f.name for f in self.schema_])

    def _renames_are_plain(self) -> None:
        for old, new in self.renames.items():
            for name in (old, new):
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise ValueError(
                        f"renames: {name!r} is not a top-level column name (nested columns are renamed with your "
                        "engine's ALTER TABLE ... RENAME COLUMN, then follow by name)"
                    )
                if name in OWN_COLUMNS:
                    raise ValueError(f"renames: {name!r} is a column the pipeline adds itself")
            if new == old:
                raise ValueError(f"renames: {old!r} → {new!r} renames nothing; leave it out")
            if new in self.renames:
                raise ValueError(
                    f"renames: {old!r} → {new!r} → {self.renames[new]!r} is a chain; rename to the last name"
                )
        targets = list(self.renames.values())
        if len(set(targets)) != len(targets):
            raise ValueError("renames: two columns are renamed to the same name")
        declared = {f.name for f in self.schema_ or []}
        for old, new in self.renames.items():
            if old in declared:
                raise ValueError(f"schema: declares {old!r}, which renames: renames to {new!r}; declare it as {new!r}")

    def _common_checks(self, names: list[str]) -> PipelineConfig:
        self._renames_are_plain()
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"schema: duplicate field names {dupes}")
        for item in self.partition_by:
            transform = parse_transform(item)
            column = transform.column if transform is not None else None
            if names and column not in names and not (column == KEY_COLUMN and self.key_format == "string"):
                raise ValueError(f"partition_by: {item!r} refers to {column!r}, which is not in schema")
        for item in self.sort_by:
            key = parse_sort(item)
            assert key is not None
            if names and key.column not in names and key.column not in KAFKA_COLUMNS.names:
                raise ValueError(f"sort_by: {item!r} refers to {key.column!r}, which is not in schema")
        if self.dead_letter_table == self.table:
            raise ValueError("dead_letter_table must differ from table")
        self._changes_check(names)
        route = self.route_by
        if route is not None and route.field is not None and names:
            if route.field not in names:
                raise ValueError(f"route_by.field: {route.field!r} is not a field of schema")
            kind = next(f.type for f in self.schema_ or [] if f.name == route.field)
            if kind not in ROUTE_TYPES:
                raise ValueError(
                    f"route_by.field: {route.field!r} is a {kind}; a table is named by text, an integer or a boolean"
                )
        return self

    def _changes_check(self, names: list[str]) -> None:
        changes = self.changes
        if changes is None:
            return
        if self.route_by is not None:
            raise ValueError("changes: a changelog goes to one table; `route_by:` is not supported with `changes:`")
        missing = [c for c in changes.key if names and c not in names]
        if missing:
            raise ValueError(f"changes.key: {missing} not in schema (the key columns are fields of the rows)")
        if changes.envelope == "debezium" and self.renames:
            raise ValueError(
                "renames: a Debezium event's columns are inside its before and after images, which `renames:` does not "
                "reach (it renames an event's own top-level fields); the table's columns keep the images' names: leave "
                "`renames:` out"
            )
        if changes.envelope == "debezium" and self.unknown_fields != "drop":
            raise ValueError("unknown_fields: a Debezium event's own fields are not the table's; leave it `drop`")
        if self.headers:
            raise ValueError("headers: a changelog's rows do not carry their change's headers yet; leave it false")
        if changes.envelope == "upsert" and self.key_format is None:
            raise ValueError(
                "changes.envelope: upsert deletes the row a tombstone's Kafka key names: give the topics a key_format "
                "(`string` for a single key column, or the keys' registry format)"
            )

    @property
    def topics(self) -> list[str]:
        """The topics of ``topics:`` (none with ``topics_pattern:``: see :meth:`topics_in`)."""
        return [t.name for t in self.topic_specs]

    @property
    def subscription(self) -> list[str] | TopicPattern:
        """What the Kafka source reads: the topics listed, or the pattern that names them."""
        return self.topics_pattern if self.topics_pattern is not None else self.topics

    @property
    def sources(self) -> list[TopicSource]:
        """What ``topics:`` or ``topics_pattern:`` name, with their encodings."""
        return [self.topics_pattern] if self.topics_pattern is not None else list(self.topic_specs)

    def selects(self, topic: str) -> bool:
        """Whether the pipeline reads ``topic``."""
        return self.topics_pattern.matches(topic) if self.topics_pattern is not None else topic in self.topics

    def topics_in(self, known: Iterable[str]) -> list[str]:
        """The pipeline's topics among ``known`` (the topics of a ledger, of Kafka's metadata):
        ``topics:`` as listed, or those ``topics_pattern:`` matches."""
        if self.topics_pattern is None:
            return self.topics
        return sorted({topic for topic in known if self.topics_pattern.matches(topic)})

    @property
    def schema_file(self) -> str | None:
        """The Avro writer schema file of the topics (plain Avro, no registry)."""
        return self.sources[0].schema_file

    @property
    def format(self) -> str:
        """The topics' value format (one per pipeline)."""
        return self.sources[0].format

    @property
    def key_format(self) -> str | None:
        """The topics' key format (one per pipeline); None: keys are not decoded."""
        return self.sources[0].key_format

    @property
    def dead_letters(self) -> str:
        return self.dead_letter_table or f"{self.table}_dead_letter"

    @property
    def group_id(self) -> str:
        """Consumer group for the advisory offset commit (lag dashboards); never read back."""
        return str(self.kafka.get("group.id", f"ingest-{self.pipeline}"))

    def redacted(self) -> dict[str, Any]:
        """The config as a dict, with credentials masked, for display."""
        data = self.model_dump(by_alias=True, mode="json")
        for section in ("kafka", "catalog", "schema_registry"):
            if data.get(section) is None:
                continue
            data[section] = {
                k: ("***" if any(w in k.lower() for w in SECRET_WORDS) else v) for k, v in data[section].items()
            }
        return data
