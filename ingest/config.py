"""Pipeline configuration: a YAML file validated by pydantic, with ``${ENV_VAR}`` interpolation.

Every validation error is reported as a :class:`~ingest.errors.ConfigError` naming the key
(``batch.max_records: ...``) so the user can fix the file without reading code.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ingest.errors import ConfigError
from ingest.records import KAFKA_COLUMNS, KEY_COLUMN, OWN_COLUMNS, arrow_type, parse_sort, parse_transform, type_name

#: table properties the pipeline sets on the tables it creates: its commits settle by observing
#: the ledger, so pyiceberg's own retries (which could append a batch twice) are off
PIPELINE_TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}

PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
TABLE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
SECRET_WORDS = ("password", "secret", "token", "credential", "sasl.jaas", "user.info")
#: what a batch does with records whose writer schema the table does not have
OnSchemaChange = Literal["evolve", "fail", "dead_letter"]
#: value formats read through a Schema Registry (the Confluent wire format: magic byte, schema id)
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
#: neither ``topics:`` nor ``topics_pattern:`` given
NO_TOPICS = "required key is missing (or give `topics_pattern:`, a regular expression the topics' names match)"
#: orphan-file removal never touches a file younger than this (``maintenance.orphan_age_hours``)
ORPHAN_AGE_FLOOR_HOURS = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _has_map(arrow: Any) -> bool:
    if isinstance(arrow, pa.MapType):
        return True
    if isinstance(arrow, pa.StructType):
        return any(_has_map(field.type) for field in arrow)
    return isinstance(arrow, pa.ListType) and _has_map(arrow.value_type)


class FieldSpec(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    type: str
    required: bool = False
    doc: str | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        return type_name(arrow_type(value))  # ValueError names what is wrong

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in OWN_COLUMNS:
            raise ValueError(f"{value!r} is a column the pipeline adds itself; rename the field")
        return value


class _Encoding(_Strict):
    """How a topic's record values (and keys) are encoded."""

    #: ``json``: a JSON object per value, fields as declared in ``schema:``; the others are the
    #: Confluent wire format, their writer schemas fetched by id from ``schema_registry``
    format: Literal["json", "avro", "protobuf", "json_schema"] = "json"
    #: the registry subject the table's schema is derived from when ``schema:`` is omitted
    #: (default: ``<topic>-value``, the topic-name strategy)
    subject: str | None = None
    #: ``avro`` without a registry: the values are plain Avro bodies (no prefix) of the writer schema
    #: in this ``.avsc`` file (relative to the config file)
    schema_file: str | None = None
    #: the keys' format, decoded into the column ``_kafka_key_decoded`` beside the raw ``_kafka_key``:
    #: ``string`` (UTF-8), or a registry format (the Confluent wire format); unset: keys stay raw bytes
    key_format: Literal["string", "avro", "protobuf", "json_schema"] | None = None
    #: the registry subject the key column's type is derived from (default: ``<topic>-key``)
    key_subject: str | None = None

    @model_validator(mode="after")
    def _schema_file_is_avro(self) -> _Encoding:
        if self.schema_file is not None and self.format != "avro":
            raise ValueError(f"schema_file is for `format: avro` topics without a registry, not {self.format!r}")
        return self

    @model_validator(mode="after")
    def _key_subject_has_a_format(self) -> _Encoding:
        if self.key_subject is not None and self.key_format not in REGISTRY_FORMATS:
            raise ValueError("key_subject is for keys in a registry format (key_format: avro, protobuf or json_schema)")
        return self


class TopicSpec(_Encoding):
    """A topic and how its record values are encoded (a plain name in ``topics:`` is a JSON topic)."""

    name: Annotated[str, Field(min_length=1)]

    @property
    def value_subject(self) -> str:
        return self.subject or f"{self.name}-value"

    @property
    def key_subject_name(self) -> str:
        return self.key_subject or f"{self.name}-key"


class TopicPattern(_Encoding):
    """``topics_pattern:``: every topic whose whole name matches ``pattern`` (a Python regular
    expression), looked up at each plan, so a topic created later is read from its earliest offset
    by the next batch. Topics whose names begin with ``__`` (Kafka's own) never match."""

    pattern: Annotated[str, Field(min_length=1)]
    #: with ``tables:``: topics another entry lists, and the patterns of the entries before this
    #: one; a topic goes to one table (listed beats matched, then the first pattern in order)
    _claimed: tuple[frozenset[str], tuple[TopicPattern, ...]] = PrivateAttr(default=(frozenset(), ()))

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"{value!r} is not a regular expression: {error}") from None
        return value

    @model_validator(mode="after")
    def _subjects_named(self) -> TopicPattern:
        if self.format in REGISTRY_FORMATS and self.schema_file is None and self.subject is None:
            raise ValueError(
                f"format {self.format!r} with a pattern needs `subject:` (the topics it will match are not known "
                "in advance, so their `<topic>-value` subjects cannot be read for the table's schema)"
            )
        if self.key_format in REGISTRY_FORMATS and self.key_subject is None:
            raise ValueError(f"key_format {self.key_format!r} with a pattern needs `key_subject:`")
        return self

    @property
    def name(self) -> str:
        """The pattern, where messages name a topic."""
        return self.pattern

    @property
    def value_subject(self) -> str:
        assert self.subject is not None  # validated when the values are in a registry
        return self.subject

    @property
    def key_subject_name(self) -> str:
        assert self.key_subject is not None  # validated when the keys are in a registry
        return self.key_subject

    def matches(self, topic: str) -> bool:
        listed, earlier = self._claimed
        return (
            not topic.startswith("__")
            and re.fullmatch(self.pattern, topic) is not None
            and topic not in listed
            and not any(other.matches(topic) for other in earlier)
        )

    def beside(self, listed: frozenset[str], earlier: tuple[TopicPattern, ...]) -> TopicPattern:
        """This pattern in a ``tables:`` entry: not taking what other entries take."""
        routed = self.model_copy()
        routed._claimed = (listed, earlier)
        return routed


#: what ``topics:`` or ``topics_pattern:`` names, with its encoding
TopicSource = TopicSpec | TopicPattern


class BatchSpec(_Strict):
    max_records: Annotated[int, Field(gt=0)] = 500_000
    #: rows written together (a data file per partition value); decoded rows are held in Arrow until
    #: then, so this and ``workers`` bound memory independently of the batch size. A batch is shared
    #: with one worker process per full chunk beyond the first, and a batch of one chunk of 1M
    #: records or more with one (ingest.engines.local.processes: a worker's imports take ~0.5-1 s)
    chunk_records: Annotated[int, Field(gt=0)] = 1_000_000
    #: seconds without progress from Kafka before the batch gives up (retryable)
    read_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    #: processes the local engine shares a batch of two chunks or more between ("auto": one per core)
    workers: int | Literal["auto"] = "auto"

    @field_validator("workers", mode="plain")
    @classmethod
    def _workers(cls, value: object) -> int | Literal["auto"]:
        if value == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256:
            return value
        raise ValueError(f"expected a number of processes from 1 to 256, or 'auto' (one per core); got {value!r}")


class DeadLetterSpec(_Strict):
    """Guardrails on poison records (``dead_letters:``): a batch whose share of dead letters is over
    ``max_ratio`` stops before anything is committed (exit 65) if it has ``min_records``, or if the
    last ``window`` batches with it are over it together: a table of dead letters never looks healthy."""

    #: the largest share of dead letters among a batch's records (0-1); unset: no limit
    max_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    #: batches the rolling share is taken over: this one and the ones committed before it
    window: Annotated[int, Field(ge=1, le=1000)] = 10
    #: a batch of fewer records is judged by the rolling share only (one poison record of two is
    #: not a trend)
    min_records: Annotated[int, Field(ge=1)] = 100
    #: a record whose value is longer is a dead letter saying so; unset: as long as Kafka lets
    #: through (the topic's ``max.message.bytes``, the consumer's ``receive.message.max.bytes``)
    max_value_bytes: Annotated[int, Field(ge=1)] | None = None


class MetricsSpec(_Strict):
    """Prometheus metrics of the runs (``metrics:``), exported when each run ends."""

    #: a node_exporter textfile collector file (``…/ingest_orders.prom``), written atomically
    textfile: str | None = None
    #: a Pushgateway URL (``http://pushgateway:9091``): pushed under ``job`` and the pipeline
    pushgateway: str | None = None
    job: str = "ingest"
    #: ``ingest run --every``: serve ``/metrics`` on this port while running
    port: Annotated[int, Field(ge=1, le=65535)] | None = None

    #: with ``tables:``, each table's run exports its own: a textfile per table, a Pushgateway group
    #: per table (``{pipeline, table}``)
    _per_table: bool = PrivateAttr(default=False)

    @property
    def per_table(self) -> bool:
        return self._per_table

    def of_table(self, table: str) -> MetricsSpec:
        """This spec for one table of ``tables:``: ``ingest_shop.prom`` becomes ``ingest_shop.<table>.prom``."""
        textfile = None
        if self.textfile is not None:
            path = Path(self.textfile)
            textfile = str(path.with_name(f"{path.stem}.{table}{path.suffix or '.prom'}"))
        routed = self.model_copy(update={"textfile": textfile})
        routed._per_table = True
        return routed

    @model_validator(mode="after")
    def _somewhere(self) -> MetricsSpec:
        if self.textfile is None and self.pushgateway is None and self.port is None:
            raise ValueError("metrics: give textfile, pushgateway or port (where the metrics go)")
        return self


class CommitSpec(_Strict):
    max_attempts: Annotated[int, Field(gt=0, le=100)] = 8
    #: how often a fenced batch is planned again within one run before giving up (retryable)
    max_replans: Annotated[int, Field(ge=0, le=100)] = 3
    #: how long one request to a REST catalog may take: a commit left unanswered this long is an
    #: unknown outcome, settled by reading the ledger again (pyiceberg itself waits forever)
    request_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0


class MaintenanceSpec(_Strict):
    """Defaults of ``ingest maintain``; five-minute batches make a snapshot and a few files each."""

    #: snapshots younger than this are kept (time travel window)
    snapshot_retention_hours: Annotated[float, Field(ge=0)] = 24.0
    #: ... and always at least this many of the newest
    keep_last_snapshots: Annotated[int, Field(ge=1)] = 20
    #: unreferenced data files younger than this are left alone: a batch writes its files before
    #: it commits them, and removing them then breaks the table (at least ORPHAN_AGE_FLOOR_HOURS)
    orphan_age_hours: float = 24.0
    #: compaction rewrites data files smaller than this ...
    small_file_mb: Annotated[float, Field(gt=0)] = 32.0
    #: ... into files of about this size (at least ``small_file_mb``)
    target_file_mb: Annotated[float, Field(gt=0)] = 128.0

    @field_validator("orphan_age_hours")
    @classmethod
    def _orphan_floor(cls, value: float) -> float:
        if value < ORPHAN_AGE_FLOOR_HOURS:
            raise ValueError(
                f"must be at least {ORPHAN_AGE_FLOOR_HOURS:g} hour(s), got {value:g}: a running batch's data files are "
                "unreferenced until it commits, and removing them then breaks the table"
            )
        return value

    @model_validator(mode="after")
    def _target_not_small(self) -> MaintenanceSpec:
        if self.target_file_mb < self.small_file_mb:
            raise ValueError(
                "target_file_mb must be at least small_file_mb, or compaction's output is small again and "
                "every run rewrites it"
            )
        return self


#: the placeholder of ``route_by.table``: where a record's route value goes in its table's name
ROUTE_VALUE = "{value}"
#: the types of a field whose values name tables
ROUTE_TYPES = ("string", "int", "long", "boolean")
#: a route value names a table only if it is made of these (what Iceberg catalogs take in a table name)
ROUTE_VALUE_CHARS = re.compile(r"^[A-Za-z0-9_]{1,100}$")


class RouteBySpec(_Strict):
    """``route_by:``: a field's (or a header's) value picks the table each record goes to."""

    #: a top-level field of the records (a column of ``schema:``) whose value names the table
    field: str | None = None
    #: instead of ``field:``, a Kafka header whose (last) value names the table
    header: str | None = None
    #: the table's name, ``{value}`` standing for the record's value: ``analytics.events_{value}``
    table: str
    #: the values taken; any other (and a missing one) makes the record a dead letter. Unset: every
    #: value that can be part of a table name (letters, digits, ``_``) is taken
    allow: Annotated[list[str], Field(min_length=1)] | None = None
    #: the table whose snapshots carry the pipeline's ledger (no rows); ``<namespace>.<pipeline>_ledger``
    ledger_table: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RouteBySpec:
        if (self.field is None) == (self.header is None):
            raise ValueError("give the value's place as `field:` (a column of schema) or as `header:`, one of them")
        namespace, _, name = self.table.rpartition(".")
        if self.table.count(ROUTE_VALUE) != 1 or ROUTE_VALUE not in name or name == ROUTE_VALUE or not namespace:
            raise ValueError(
                f"table: {self.table!r} must be 'namespace.name' with {ROUTE_VALUE} once in the name beside a fixed "
                f"part, such as 'analytics.events_{ROUTE_VALUE}'"
            )
        if self.table != self.table.lower():
            raise ValueError(
                f"table: {self.table!r} has capitals; catalogs such as Glue and Hive fold table names to lower case, "
                "so the routed tables' names are lower case (a value's capitals too)"
            )
        if not TABLE_ID.fullmatch(self.table.replace(ROUTE_VALUE, "x")):
            raise ValueError(f"table: {self.table!r} is not 'namespace.table' once {ROUTE_VALUE} is filled in")
        for value in self.allow or []:
            if not ROUTE_VALUE_CHARS.fullmatch(value):
                raise ValueError(f"allow: {value!r} cannot be part of a table name (letters, digits and '_' only)")
        if self.ledger_table is not None and not TABLE_ID.fullmatch(self.ledger_table):
            raise ValueError("ledger_table: must be 'namespace.table'")
        return self

    @property
    def namespace(self) -> str:
        return self.table.rpartition(".")[0]

    def table_of(self, value: str) -> str:
        """The table ``value`` names: lower case, as catalogs that fold case name it (``US`` and
        ``us`` are one table everywhere)."""
        return self.table.replace(ROUTE_VALUE, value.lower())


class PipelineConfig(_Strict):
    pipeline: str
    kafka: dict[str, str | int | float | bool]
    topic_specs: Annotated[list[TopicSpec], Field(alias="topics")] = []
    #: instead of ``topics:``, every topic whose name matches, as Kafka Connect's ``topics.regex``
    topics_pattern: TopicPattern | None = None
    #: confluent-kafka ``SchemaRegistryClient`` properties (``url``, ``basic.auth.user.info``, ...)
    schema_registry: dict[str, str | int | float | bool] | None = None
    #: where the first batch starts: ``earliest``, ``latest``, or an ISO-8601 timestamp with a zone
    #: (the first offsets at or after it); partitions added later always start at earliest
    start: Literal["earliest", "latest"] | AwareDatetime = "earliest"
    on_data_loss: Literal["fail", "skip"] = "fail"
    catalog: dict[str, str]
    table: str
    #: the rows table's fields; omitted, they are derived from the registry subject of the topic(s)
    schema_: Annotated[list[FieldSpec] | None, Field(alias="schema", min_length=1)] = None
    #: what a batch does with records whose writer schema the table does not have: ``evolve`` the
    #: table with the batch's commit, ``fail`` (exit 65, nothing committed), or ``dead_letter`` them
    on_schema_change: OnSchemaChange = "evolve"
    #: columns renamed by the writers, old top-level name → new: the table's column (its field id)
    #: is renamed with the next batch's commit, and records of either name land in it
    renames: dict[str, str] = {}
    #: what a JSON record's fields that ``schema:`` does not declare become: ``drop``ped (counted),
    #: ``capture``d as one JSON object in the column ``_extra``, or the record a ``dead_letter``
    unknown_fields: Literal["drop", "capture", "dead_letter"] = "drop"
    #: values taken by default that are dead letters instead when listed: ``nan`` (NaN or ±Infinity
    #: in a float or double column, any format), ``naive_timestamps`` (a JSON timestamptz string
    #: without a zone, otherwise read as UTC), ``date_only_timestamps`` (a JSON timestamp or
    #: timestamptz string that is a date alone, otherwise read as midnight)
    refuse: list[Literal["nan", "naive_timestamps", "date_only_timestamps"]] = []
    partition_by: list[str] = []
    #: Iceberg table properties the rows table is created with (and an existing one must have)
    table_properties: dict[str, str] = {}
    #: the rows table's sort order: top-level columns, ``col`` or ``col desc``
    sort_by: list[str] = []
    #: each record's Kafka headers in the column ``_kafka_headers`` (a map of each key's last value)
    headers: bool = False
    dead_letter_table: str | None = None
    dead_letter_policy: Annotated[DeadLetterSpec, Field(alias="dead_letters")] = DeadLetterSpec()
    batch: BatchSpec = BatchSpec()
    commit: CommitSpec = CommitSpec()
    maintenance: MaintenanceSpec = MaintenanceSpec()
    metrics: MetricsSpec | None = None
    #: a field's or a header's value picks each record's table (``table:`` is then the ledger's)
    route_by: RouteBySpec | None = None

    #: with ``tables:``, the other entries' tables: a topic new to this table's ledger that one of
    #: them has read is not read again here from the start (see :meth:`ingest.pipeline.Pipeline.plan`)
    _siblings: tuple[str, ...] = PrivateAttr(default=())

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

    @field_validator("topic_specs", mode="before")
    @classmethod
    def _plain_names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("topics_pattern", mode="before")
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

    @field_validator("catalog", "table_properties", mode="before")
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
            if _has_map(arrow_type(field.type)):
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


def _format(error: ValidationError, data: Any) -> str:
    lines = []
    for item in error.errors():
        where = _where(data, item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see conf/orders.yaml for the keys)"
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


def chosen(routes: Sequence[PipelineConfig], source: str, table: str | None) -> PipelineConfig:
    """The route of ``table`` (``--table``), or the only one."""
    if table is not None:
        for route in routes:
            if route.table == table:
                return route
        raise ConfigError(f"{source} has no table {table!r}; its tables: {', '.join(r.table for r in routes)}")
    if len(routes) > 1:
        raise ConfigError(
            f"{source} routes to {len(routes)} tables ({', '.join(r.table for r in routes)}): name one with "
            "--table (`ingest run`, `status`, `history`, `verify`, `check` and `maintain` take them all without it)"
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


#: the keys of one table: an entry of ``tables:`` has these; at the top level beside ``tables:``
#: they are every entry's default, but for ``ROUTE_KEYS``
TABLE_KEYS = frozenset(
    {"table", "topics", "topics_pattern", "schema", "on_schema_change", "renames", "unknown_fields", "refuse",
     "partition_by", "table_properties", "sort_by", "headers", "dead_letter_table"}
)  # fmt: skip
ROUTE_KEYS = frozenset({"table", "topics", "topics_pattern"})


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
