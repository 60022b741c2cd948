"""The seams of the pipeline: what the commit loop and the runner need from the world, as protocols.

The commit loop (:mod:`ingest.committer`) and the pipeline (:mod:`ingest.pipeline`) depend on these,
never on a concrete adapter. The adapters that satisfy them:

* :class:`LedgerTable` (and :class:`RoutedTable`): :class:`ingest.iceberg.table.IcebergTable` (any
  Iceberg catalog), and :class:`ingest.testing.memory_table.MemoryTable` (in memory, with lost acknowledgements
  and foreign commits, for tests and for anyone checking their own integration);
* :class:`Source`: :class:`ingest.kafka.source.KafkaSource`;
* :class:`TableMaker`: :class:`ingest.assembly.IcebergTableMaker` (``route_by``'s tables);
* :class:`Engine`: :class:`ingest.engines.local.LocalEngine` and :class:`ingest.engines.spark.SparkEngine`;
* :class:`ValueDecoder`: :class:`ingest.formats.json.Decoder` (JSON against the declared schema) and
  :class:`ingest.formats.avro.AvroDecoder` (the Confluent wire format), the seam record formats plug into;
* :class:`SchemaRegistry`: :class:`ingest.kafka.registry.Registry` (any Confluent-compatible registry).

Nothing here imports an adapter's library: this module sits below every adapter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, overload

import pyarrow as pa

from ingest.changes import KeyDeletes
from ingest.core.ledger import SnapshotView, TopicPartition
from ingest.core.plan import Batch, KafkaView
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.intents import DataFile, RefIntent, SnapshotIntent
from ingest.progress import Advanced
from ingest.records import Declared, Decoded, RawChunk


@dataclass(frozen=True)
class Head:
    """A branch head as a table handle last read it, and the table's properties then."""

    snapshot_id: int | None
    properties: Mapping[str, str]


class TopicMatcher(Protocol):
    """The topics a source reads when they are matched rather than listed (``topics_pattern:``,
    :class:`ingest.config.TopicPattern`)."""

    @property
    def pattern(self) -> str: ...

    def matches(self, name: str) -> bool:
        """Whether topic ``name`` is one to read."""
        ...


class Source(Protocol):
    """Where a pipeline's records come from (:class:`ingest.kafka.source.KafkaSource`): what the
    batch loop asks of it to plan; the engines read the planned ranges themselves."""

    def describe(self) -> KafkaView:
        """The topics' partitions now: their watermarks, ids and the cluster's."""
        ...

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        """Each partition's first offset whose record is at or after ``timestamp_ms`` (its end if none is)."""
        ...

    def commit_advisory(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Tell Kafka's consumer group how far the ledger reached, for lag dashboards (never read
        back: the ledger in the table is the truth), without waiting for the answer; a failure is
        only logged."""
        ...


class FileWriter(Protocol):
    """Where a task writes a batch's data files: a table (:class:`LedgerTable`), or the tables
    ``route_by`` names (:class:`ingest.route_by.writing.RoutedTables`)."""

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[DataFile]:
        """``data`` as data files, invisible until committed."""
        ...


class LedgerTable(Protocol):
    """A table whose snapshots carry ledgers, committed to by compare-and-swap on the branch head.

    ``commit`` makes one attempt: it requires what the handle holds and raises
    :class:`ingest.errors.CommitConflict` if the head moved (nothing applied) or
    :class:`ingest.errors.CommitUnknown` if the outcome is open (it may have applied). It never
    retries: the commit loop settles both by observing again.
    """

    @property
    def identifier(self) -> str: ...

    @property
    def branch(self) -> str: ...

    def refresh(self, max_age_s: float = 0.0) -> Head:
        """The head after loading the table again, unless the handle's view is younger than ``max_age_s``."""
        ...

    def head(self) -> Head:
        """The head as the handle holds it (no catalog call)."""
        ...

    def ancestry(self, start: int | None = None) -> Iterator[SnapshotView]:
        """Snapshots from the head (or ``start``) back through parent links, until the chain ends."""
        ...

    def evolve_to(self, fields: Sequence[Declared]) -> None:
        """Write rows of ``fields`` from now on: the table's schema takes them (new columns, matched
        by name) in the next commit through this handle, together with its data, never alone.
        Raises :class:`ingest.errors.SchemaMoved` from ``commit`` if another writer changed the
        schema after files were written for the evolved one (nothing is applied)."""
        ...

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[DataFile]:
        """``data`` as data files in the table's location, invisible until committed."""
        ...

    def adopt(self, paths: Sequence[str]) -> list[DataFile]:
        """Data files :meth:`write` wrote into this table's location earlier (maybe in another
        process that is gone), as they can be committed now. Raises
        :class:`ingest.errors.WrittenFilesGone` if one is no longer stored."""
        ...

    @overload
    def commit(self, intent: SnapshotIntent) -> int: ...

    @overload
    def commit(self, intent: RefIntent) -> None: ...

    def commit(self, intent: SnapshotIntent | RefIntent) -> int | None:
        """One compare-and-swap commit of ``intent`` (see :mod:`ingest.intents`) on what the handle
        holds: a snapshot intent requires the branch head and returns the new snapshot's id; a ref
        intent requires the refs it names (an expiry: every ref) and makes no snapshot."""
        ...

    def branch_head(self, branch: str) -> int | None:
        """The snapshot branch (or tag) ``branch`` points at as the handle holds it; None if it does not exist."""
        ...

    def on_branch(self, branch: str) -> Self:
        """The same table, reading and committing on ``branch``."""
        ...

    def dead_letter_coordinates(self, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]]) -> pa.Table:
        """A dead-letter table's coordinates (topic, partition, offset) in ``spans`` (``[start, end)``
        offset ranges per partition) at the head the handle holds."""
        ...


class RoutedTable(LedgerTable, Protocol):
    """A table ``route_by`` routes rows to: a ledger table (its snapshots carry its floor) that
    has write-only copies for worker processes and Spark executors."""

    def detached(self) -> Self:
        """A copy that only writes data files (no catalog connection, no credentials)."""
        ...


class TableMaker(Protocol):
    """Where ``route_by``'s tables come from (:class:`ingest.assembly.IcebergTableMaker`): each
    opened, or created if missing, as records first name it, laid out as the config says."""

    def open(self, name: str, fields: Sequence[Declared]) -> RoutedTable:
        """Table ``name``, loaded as it is, or created for rows of ``fields``."""
        ...

    def misfit(self, table: RoutedTable, fields: Sequence[Declared]) -> str | None:
        """Why ``table`` cannot take rows of ``fields`` laid out as the config says (its partition
        spec, properties or sort order differ); None if it can. Whether its schema can evolve to
        take them is :meth:`LedgerTable.evolve_to`'s to say."""
        ...


@dataclass
class Produced:
    """What an engine made of a batch's ranges: committed nowhere yet."""

    files: list[DataFile]
    dead_letters: DeadLetterSpool
    records: int
    nbytes: int
    #: newest record timestamp read per partition (ms)
    timestamps: dict[TopicPartition, int]
    #: records with fields the table does not declare (``unknown_fields``)
    unknown: int = 0
    #: ``route_by``: tables rows were routed to that do not exist yet (those rows are in no file)
    missing: frozenset[str] = frozenset()
    #: ``changes:``: the keys the batch changes, whose live rows its commit deletes (the files hold
    #: each key's newest row, if an upsert)
    deletes: KeyDeletes | None = None


@dataclass(frozen=True)
class TableShape:
    """What a table is to a reader of lineage: its identifier, where its files are, its columns."""

    identifier: str
    #: the table's location (``s3://bucket/warehouse/db/table``, ``file:///…``)
    location: str
    #: each top-level column's name and Iceberg type (``long``, ``struct<…>``)
    columns: tuple[tuple[str, str], ...]
    #: the newest snapshot of the branch (None: none yet)
    snapshot_id: int | None


class Engine(Protocol):
    """Turns a planned batch's ranges into data files (read, decode, write); never commits."""

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        """Data files of ``batch``'s records, decoded into the table's ``fields``; ``advanced`` hears,
        chunk by chunk and from any thread, what was read, decoded and written so far
        (:data:`ingest.progress.Advanced`)."""
        ...

    def writing_to(self, rows: Any) -> Engine:
        """The same engine (its workers, its Spark session) writing data files with ``rows``, the
        handle another run commits with (a replay's branch: the schema a batch evolves is staged on
        the handle that commits it, and files must be written with it). Closing it is the original's."""
        ...

    def close(self) -> None:
        """Release what the engine holds (worker processes, a Spark session it started)."""
        ...


class ValueDecoder(Protocol):
    """Kafka record values to rows of the table's schema, poison records split off as dead letters.
    The seam a format (JSON today; Avro, Protobuf, JSON Schema through a registry) plugs into."""

    def decode(self, chunk: RawChunk) -> Decoded: ...


@dataclass(frozen=True)
class WriterSchema:
    """A schema records were written with, as a Schema Registry holds it."""

    schema_id: int
    #: ``AVRO``, ``PROTOBUF`` or ``JSON`` (the registry's schema types)
    kind: str
    text: str
    #: the schemas this one refers to (a Protobuf import, an Avro named type, a JSON Schema ``$ref``
    #: to another document), by the name it refers to them with, each resolved with its own
    references: tuple[tuple[str, WriterSchema], ...] = ()


class SchemaRegistry(Protocol):
    """Writer schemas by id, and a subject's latest (:class:`ingest.kafka.registry.Registry`)."""

    def by_id(self, schema_id: int) -> WriterSchema | None:
        """The schema registered under ``schema_id``; None if the registry has none (a poison record's
        id). Raises :class:`ingest.errors.RegistryUnavailable` if the registry does not answer."""
        ...

    def latest(self, subject: str) -> WriterSchema:
        """The latest version registered under ``subject``."""
        ...
