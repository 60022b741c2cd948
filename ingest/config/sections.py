"""The sections of a pipeline's config (``topics:``, ``batch:``, ``dead_letters:``, ``metrics:``,
``commit:``, ``maintenance:``, ``route_by:``), each a pydantic model that names a wrong key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from ingest.format_names import (
    FORMAT,
    KEY_FORMATS,
    REGISTRY_FORMATS,
    SCHEMA_FILE_FORMATS,
    KeyFormat,
    ValueFormat,
    spoken,
)
from ingest.records import OWN_COLUMNS
from ingest.type_names import arrow_type, type_name

TABLE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_REGISTRY_KEYS = [name for name in KEY_FORMATS if FORMAT[name].registry]
#: neither ``topics:`` nor ``topics_pattern:`` given
NO_TOPICS = "required key is missing (or give `topics_pattern:`, a regular expression the topics' names match)"
#: orphan-file removal never touches a file younger than this (``maintenance.orphan_age_hours``)
ORPHAN_AGE_FLOOR_HOURS = 1.0


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True)


def has_map(arrow: Any) -> bool:
    if isinstance(arrow, pa.MapType):
        return True
    if isinstance(arrow, pa.StructType):
        return any(has_map(field.type) for field in arrow)
    return isinstance(arrow, pa.ListType) and has_map(arrow.value_type)


class FieldSpec(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    """the field's name in the record, and the column's"""
    type: str
    """an Iceberg type name: ``boolean``, ``int``, ``long``, ``float``, ``double``, ``decimal(P,S)``, ``string``,
    ``binary``, ``date``, ``time``, ``timestamp``, ``timestamptz``, ``uuid``, ``list<T>``, ``struct<a: T, ...>``
    """
    required: bool = False
    """a record without it (or with null) is a dead letter; the column is required"""
    doc: str | None = None
    """the column's doc in the table's schema"""

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


class _Encoding(Strict):
    """How a topic's record values (and keys) are encoded."""

    format: ValueFormat = "json"
    """``json``: a JSON object per value, fields as declared in ``schema:``; the others are the Confluent wire format,
    their writer schemas fetched by id from ``schema_registry``
    """
    subject: str | None = None
    """the registry subject the table's schema is derived from when ``schema:`` is omitted (default: ``<topic>-value``,
    the topic-name strategy)
    """
    schema_file: str | None = None
    """``avro`` without a registry: the values are plain Avro bodies (no prefix) of the writer schema in this ``.avsc``
    file (relative to the config file)
    """
    key_format: KeyFormat | None = None
    """the keys' format, decoded into the column ``_kafka_key_decoded`` beside the raw ``_kafka_key``: ``string``
    (UTF-8), or a registry format (the Confluent wire format); unset: keys stay raw bytes
    """
    key_subject: str | None = None
    """the registry subject the key column's type is derived from (default: ``<topic>-key``)"""

    @model_validator(mode="after")
    def _schema_file_has_its_format(self) -> _Encoding:
        if self.schema_file is not None and not FORMAT[self.format].schema_file:
            raise ValueError(
                f"schema_file is for `format: {spoken(SCHEMA_FILE_FORMATS)}` topics without a registry, not "
                f"{self.format!r}"
            )
        return self

    @model_validator(mode="after")
    def _key_subject_has_a_format(self) -> _Encoding:
        if self.key_subject is not None and self.key_format not in REGISTRY_FORMATS:
            raise ValueError(f"key_subject is for keys in a registry format (key_format: {spoken(_REGISTRY_KEYS)})")
        return self


class TopicSpec(_Encoding):
    """A topic and how its record values are encoded (a plain name in ``topics:`` is a JSON topic)."""

    name: Annotated[str, Field(min_length=1)]
    """the Kafka topic"""

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
    """a regular expression (Python's ``re``, matched in full) of the topic names to read; new matching topics are read
    from their earliest offset
    """
    _claimed: tuple[frozenset[str], tuple[TopicPattern, ...]] = PrivateAttr(default=(frozenset(), ()))
    """with ``tables:``: topics another entry lists, and the patterns of the entries before this one; a topic goes to
    one table (listed beats matched, then the first pattern in order)
    """

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


class BatchSpec(Strict):
    max_records: Annotated[int, Field(gt=0)] = 500_000
    """at most this many records per batch, shared fairly across partitions"""
    chunk_records: Annotated[int, Field(gt=0)] = 1_000_000
    """rows written together (a data file per partition value); decoded rows are held in Arrow until then, so this and
    ``workers`` bound memory independently of the batch size. A batch is shared with one worker process per full
    chunk beyond the first, and a batch of one chunk of 1M records or more with one (ingest.engines.local.processes:
    a worker's imports take ~0.5-1 s)
    """
    read_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """seconds without progress from Kafka before the batch gives up (retryable)"""
    workers: int | Literal["auto"] = "auto"
    """processes the local engine shares a batch of two chunks or more between ("auto": one per core)"""

    @field_validator("workers", mode="plain")
    @classmethod
    def _workers(cls, value: object) -> int | Literal["auto"]:
        if value == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 256:
            return value
        raise ValueError(f"expected a number of processes from 1 to 256, or 'auto' (one per core); got {value!r}")


class DeadLetterSpec(Strict):
    """Guardrails on poison records (``dead_letters:``): a batch whose share of dead letters is over
    ``max_ratio`` stops before anything is committed (exit 65) if it has ``min_records``, or if the
    last ``window`` batches with it are over it together: a table of dead letters never looks healthy."""

    max_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    """the largest share of dead letters among a batch's records (0-1); unset: no limit"""
    window: Annotated[int, Field(ge=1, le=1000)] = 10
    """batches the rolling share is taken over: this one and the ones committed before it"""
    min_records: Annotated[int, Field(ge=1)] = 100
    """a batch of fewer records is judged by the rolling share only (one poison record of two is not a trend)"""
    max_value_bytes: Annotated[int, Field(ge=1)] | None = None
    """a record whose value is longer is a dead letter saying so; unset: as long as Kafka lets through (the topic's
    ``max.message.bytes``, the consumer's ``receive.message.max.bytes``)
    """


class MetricsSpec(Strict):
    """Prometheus metrics of the runs (``metrics:``), exported after each batch, while one runs, and as it ends."""

    textfile: str | None = None
    """a node_exporter textfile collector file (``…/ingest_orders.prom``), written atomically"""
    pushgateway: str | None = None
    """a Pushgateway URL (``http://pushgateway:9091``): pushed under ``job`` and the pipeline"""
    job: str = "ingest"
    """the Prometheus ``job`` label (the Pushgateway group's name)"""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """``ingest run --every``: serve ``/metrics`` on this port while running"""

    _per_table: bool = PrivateAttr(default=False)
    """with ``tables:``, each table's run exports its own: a textfile per table, a Pushgateway group per table
    (``{pipeline, table}``)
    """

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


class CommitSpec(Strict):
    max_attempts: Annotated[int, Field(gt=0, le=100)] = 8
    """commit attempts per batch; each observes the ledger again first, so no attempt can land a batch twice"""
    max_replans: Annotated[int, Field(ge=0, le=100)] = 3
    """how often a fenced batch is planned again within one run before giving up (retryable)"""
    request_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """how long one request to a REST catalog may take: a commit left unanswered this long is an unknown outcome,
    settled by reading the ledger again (pyiceberg itself waits forever)
    """


class MaintenanceSpec(Strict):
    """Defaults of ``ingest maintain``; five-minute batches make a snapshot and a few files each."""

    snapshot_retention_hours: Annotated[float, Field(ge=0)] = 24.0
    """snapshots younger than this are kept (time travel window)"""
    keep_last_snapshots: Annotated[int, Field(ge=1)] = 20
    """... and always at least this many of the newest"""
    orphan_age_hours: float = 24.0
    """unreferenced data files younger than this are left alone: a batch writes its files before it commits them, and
    removing them then breaks the table (at least ORPHAN_AGE_FLOOR_HOURS)
    """
    small_file_mb: Annotated[float, Field(gt=0)] = 32.0
    """compaction rewrites data files smaller than this ..."""
    target_file_mb: Annotated[float, Field(gt=0)] = 128.0
    """... into files of about this size (at least ``small_file_mb``)"""

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


class RouteBySpec(Strict):
    """``route_by:``: a field's (or a header's) value picks the table each record goes to."""

    field: str | None = None
    """a top-level field of the records (a column of ``schema:``) whose value names the table"""
    header: str | None = None
    """instead of ``field:``, a Kafka header whose (last) value names the table"""
    table: str
    """the table's name, ``{value}`` standing for the record's value: ``analytics.events_{value}``"""
    allow: Annotated[list[str], Field(min_length=1)] | None = None
    """the values taken; any other (and a missing one) makes the record a dead letter. Unset: every value that can be
    part of a table name (letters, digits, ``_``) is taken
    """
    ledger_table: str | None = None
    """the table whose snapshots carry the pipeline's ledger (no rows); ``<namespace>.<pipeline>_ledger``"""

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
