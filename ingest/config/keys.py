"""The keys of a pipeline config, each with its type, default and description: the reference
``ingest config-schema`` prints and the docs show. :class:`ingest.config.model.PipelineConfig` adds
the checks across them and what a run reads off them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AwareDatetime, Field

from ingest.config.changes_spec import ChangesSpec
from ingest.config.lineage_spec import LineageSpec
from ingest.config.scheduling import AirflowSpec
from ingest.config.sections import (
    BatchSpec,
    CommitSpec,
    DeadLetterSpec,
    FieldSpec,
    MaintenanceSpec,
    MetricsSpec,
    RouteBySpec,
    Strict,
    TopicPattern,
    TopicSpec,
)
from ingest.format_names import OnSchemaChange

#: the keys of one table: an entry of ``tables:`` has these; at the top level beside ``tables:``
#: they are every entry's default, but for ``ROUTE_KEYS``
TABLE_KEYS = frozenset(
    {"table", "topics", "topics_pattern", "schema", "on_schema_change", "renames", "unknown_fields", "refuse",
     "partition_by", "table_properties", "sort_by", "headers", "dead_letter_table"}
)  # fmt: skip
ROUTE_KEYS = frozenset({"table", "topics", "topics_pattern"})


class PipelineKeys(Strict):
    """A pipeline: Kafka topics read in batches into one Iceberg table, exactly once."""

    pipeline: str
    """the pipeline's stable id (letters, digits, ``_``, ``-``): it scopes the ledger keys ``ingest.<pipeline>.*`` in
    the snapshot summaries, so changing it starts a new ledger
    """
    kafka: dict[str, str | int | float | bool]
    """librdkafka consumer properties, passed through as they are (``bootstrap.servers``, ``security.protocol``,
    ``sasl.*``, ...); ``group.id`` and the offset settings are the pipeline's own
    """
    topic_specs: Annotated[list[TopicSpec], Field(alias="topics")] = []
    """the topics to read: names, or entries with a name and how its values (and keys) are decoded; or
    ``topics_pattern:``
    """
    topics_pattern: TopicPattern | None = None
    """instead of ``topics:``, every topic whose name matches, as Kafka Connect's ``topics.regex``"""
    schema_registry: dict[str, str | int | float | bool] | None = None
    """confluent-kafka ``SchemaRegistryClient`` properties (``url``, ``basic.auth.user.info``, ...)"""
    start: Literal["earliest", "latest"] | AwareDatetime = "earliest"
    """where the first batch starts: ``earliest``, ``latest``, or an ISO-8601 timestamp with a zone (the first offsets
    at or after it); partitions added later always start at earliest
    """
    on_data_loss: Literal["fail", "skip"] = "fail"
    """what a batch does when Kafka no longer holds offsets the ledger has not read (retention deleted them): ``fail``
    (exit 65, nothing committed), or ``skip`` them, recording the lost range in the snapshot summary
    """
    catalog: dict[str, str]
    """pyiceberg catalog properties (``type``: ``sql``, ``rest``, ``glue``, ...; ``uri``, ``warehouse``, credentials);
    ``name`` is the catalog's name
    """
    table: str
    """the rows table, ``namespace.name``: created if missing (with ``partition_by``, ``sort_by`` and
    ``table_properties``)
    """
    schema_: Annotated[list[FieldSpec] | None, Field(alias="schema", min_length=1)] = None
    """the rows table's fields; omitted, they are derived from the registry subject of the topic(s)"""
    on_schema_change: OnSchemaChange = "evolve"
    """what a batch does with records whose writer schema the table does not have: ``evolve`` the table with the
    batch's commit, ``fail`` (exit 65, nothing committed), or ``dead_letter`` them
    """
    renames: dict[str, str] = {}
    """columns renamed by the writers, old top-level name → new: the table's column (its field id) is renamed with the
    next batch's commit, and records of either name land in it
    """
    unknown_fields: Literal["drop", "capture", "dead_letter"] = "drop"
    """what a JSON record's fields that ``schema:`` does not declare become: ``drop``ped (counted), ``capture``d as one
    JSON object in the column ``_extra``, or the record a ``dead_letter``
    """
    refuse: list[Literal["nan", "naive_timestamps", "date_only_timestamps"]] = []
    """values taken by default that are dead letters instead when listed: ``nan`` (NaN or ±Infinity in a float or
    double column, any format), ``naive_timestamps`` (a JSON timestamptz string without a zone, otherwise read as
    UTC), ``date_only_timestamps`` (a JSON timestamp or timestamptz string that is a date alone, otherwise read as
    midnight)
    """
    partition_by: list[str] = []
    """the rows table's partition spec: Iceberg transforms of top-level columns: ``col``, ``year(c)``, ``month(c)``,
    ``day(c)``, ``hour(c)``, ``bucket(N, c)``, ``truncate(W, c)``
    """
    table_properties: dict[str, str] = {}
    """Iceberg table properties the rows table is created with (and an existing one must have)"""
    sort_by: list[str] = []
    """the rows table's sort order: top-level columns, ``col`` or ``col desc``"""
    headers: bool = False
    """each record's Kafka headers in the column ``_kafka_headers`` (a map of each key's last value)"""
    dead_letter_table: str | None = None
    """the table of the records that cannot be rows (with their raw value, headers and why); default:
    ``<table>_dead_letter``
    """
    dead_letter_policy: Annotated[DeadLetterSpec, Field(alias="dead_letters")] = DeadLetterSpec()
    """when too many dead letters stop a batch, and how large a value may be"""
    batch: BatchSpec = BatchSpec()
    """how much one batch reads, and how it reads and writes it"""
    commit: CommitSpec = CommitSpec()
    """how often a commit is attempted and a fenced batch planned again"""
    maintenance: MaintenanceSpec = MaintenanceSpec()
    """what ``ingest maintain`` keeps, expires and compacts"""
    metrics: MetricsSpec | None = None
    """where a run's Prometheus metrics go (a textfile, a Pushgateway, or ``/metrics``); none by default"""
    lineage: LineageSpec | None = None
    """where the runs' OpenLineage events go; default: ``OPENLINEAGE_URL`` or ``openlineage.yml``, else none"""
    airflow: AirflowSpec = AirflowSpec()
    """how Airflow runs this config's DAG (``jobs/airflow/ingest_dags.py``): schedule, retries, timeouts, engine"""
    changes: ChangesSpec | None = None
    """the topics are changelogs (Debezium's, or keyed upsert topics): each record upserts or deletes the row of its
    key, and the table holds every key's newest row; none by default (each record is a new row)
    """
    route_by: RouteBySpec | None = None
    """a field's or a header's value picks each record's table (``table:`` is then the ledger's)"""
