"""The exactly-once protocol as a Hypothesis state machine driving the real batch loop.

Each writer is a run of the real :class:`ingest.pipeline.Pipeline` (:meth:`~ingest.pipeline.Pipeline.run_batch`:
plan from the ledger, settle what the ledger it builds on owes the dead-letter table, produce the
batch, evolve the table's schema to the registry's writer schemas, commit the rows with the ledger
and the marker of its dead letters, then the dead letters, planned again when fenced) against
in-memory tables, Kafka and Schema Registry (:mod:`ingest.testing`: the same fakes any
integration can use), and an engine that reads the machine's model of the records under the
writer's decoding. Nothing of the loop is mirrored here: a change to the order of its steps is a
change to what this machine runs.

What the machine varies:

* Kafka: a few partitions whose high watermark grows (partitions can be added). Whether an offset
  holds a good record, a poison record or nothing (a transaction marker, an aborted record:
  offsets are not contiguous) is a fixed function of the offset.
* Up to three writers of one pipeline, each with its own table handles (a run that keeps them
  from batch to batch, as ``--every`` does, until it dies). Two have one cap, so they plan and
  land the same batches, but decode differently (a rolling deploy of a fix: half the records the
  old one sets aside as dead letters are rows to the new one); the third has another cap (writers
  planned from one ledger fence each other). A writer plans from the metadata its handle holds when
  it loaded it less than a second ago, as a run does.
* Around a writer's steps (as its engine begins reading, once its files are written) Hypothesis
  draws what happens meanwhile: another writer's whole batch, records produced, a writer schema
  deployed, another tool's commit or ``ALTER TABLE``, an expiry, an operator's reset, or the
  writer dies there.
* Every commit attempt meets a fault drawn by Hypothesis (:data:`ingest.testing.Fault`): applied,
  acknowledgement lost, refused with an unknown outcome, or the writer's process dies before or
  after the commit is applied; or, before the attempt, what may happen meanwhile happens (another
  writer's batch, another tool's commit — compaction, another pipeline —, ``ingest maintain``'s
  expiry planned by the real :mod:`ingest.core.expiry`, a reset). So another writer slips in
  between every observation and every commit.
* Another tool corrupts a table after the pipeline's last commit (deletes a row, appends a row past
  the ledger, copies a row or a dead letter, or stores a record as both a row and a dead letter) and
  later undoes it. While the corruption stands no batch, reset or expiry runs: they would change how
  many times verify expects the record.
* An operator runs ``ingest reset`` (the real :func:`ingest.ops.reset.reset`) to earliest,
  latest or chosen offsets, while writers may be mid-batch; its commit meets the same faults, and
  the same command may be run again (an orchestrator's retry).
* An operator runs ``ingest replay --rollback`` (the real :func:`ingest.ops.replay.roll_back`) to
  a snapshot of main's line, also while a writer is mid-batch (a copy that observed a batch's
  marker before the rollback then settles it late); its commits meet the same faults. Left out:
  a rollback that would discard a batch reading what the snapshot's own line had read (a known
  gap, see :meth:`ProtocolMachine.rollback_targets`).
* An operator runs ``ingest replay`` (the real :func:`ingest.ops.replay.replay`) from such a
  snapshot into a branch, to compare or with ``--publish``, from a writer's decoding, also while a
  writer is mid-batch; the same command may be run again (it continues its branch, and publishes
  it then), its commits and batches meeting the same faults and interleavings as a writer's.
* Schemas: the producing service deploys new writer schemas (each adds a column), so a batch may
  read records the table's schema lacks columns for. The loop evolves the table to the subject's
  latest schema before it produces, and to the schemas a produced batch met (the engine raises
  :class:`~ingest.errors.SchemaAhead`), as it does on Kafka: the evolution goes into the batch's
  own commit. Another tool may add a column of its own at any time, also
  between a writer's write and its commit (the files, written for the evolved schema, must then
  never be committed: :class:`~ingest.errors.SchemaMoved` ends that writer's run).

Invariants after every step, against a model kept from every snapshot ever committed on main's
line (expiry removes none of it from :attr:`ingest.testing.memory_table.MemoryCatalog.log`; what a
rollback discarded is no longer on the line): each batch starts where the ledger before it
ended, each reset lands at most once; every record is in the rows table as many times as landed
batches read it as a row under their decoding (once, unless a backward reset had it read again;
never, if a forward reset skipped it), nothing else is; a record a landed batch
read as poison is in the dead-letter table exactly once (or, right after a crash between a batch's
two commits, in the files its marker names; after a crash between a rollback's, as its rewind
will leave them), none other is, none is duplicated and the dead-letter floor holds (a
corruption taken out); ``ingest verify``'s reasoning (the real :func:`ingest.core.coverage.coverage`
and its check, from the ledger history alone) finds every partition correct, whatever the sequence
of resets and rollbacks, exactly while no table is corrupted, and while one is, finds the
corrupted record and what is wrong with it, nothing else; every snapshot's schema has the columns
of every row it holds, and the pipeline's columns change only in snapshots of its batches. At the end
a fault-free writer drains Kafka and the ledger reaches every high watermark: nothing stalls.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest.config import PipelineConfig, parse
from ingest.core.coverage import Coverage, coverage
from ingest.core.expiry import MAIN, Ref, doomed, protected
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition, carried_reads
from ingest.core.ledger_codec import (
    COMPACTION,
    MAINTENANCE_KEY,
    decode,
    decode_counts,
    encode,
    find_ledger,
    read_extra,
    registered_pipelines,
)
from ingest.core.plan import Batch
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.errors import (
    BranchGone,
    CommitGaveUp,
    ConfigError,
    FatalError,
    Fenced,
    MainMoved,
    PublishRefused,
    ReplayImpossible,
    RollbackRefused,
    SchemaAhead,
    SchemaMoved,
)
from ingest.ops.replay import replay as ingest_replay
from ingest.ops.replay import roll_back
from ingest.ops.reset import reset as ingest_reset
from ingest.ops.reset_command import ResetCommand, ResetTarget
from ingest.ops.verify import judge_partition
from ingest.ops.verify_reads import expected_reads
from ingest.ops.verify_report import Problem
from ingest.pipeline import Pipeline
from ingest.ports import Produced, WriterSchema
from ingest.progress import Advanced
from ingest.records import Declared
from ingest.retry import without_backoff
from ingest.runner import Run
from ingest.testing.memory_kafka import MemoryRegistry, MemorySource
from ingest.testing.memory_state import Crashed, Fault, MemorySnapshot, ticking
from ingest.testing.memory_table import MemoryCatalog, MemoryTable
from ingest.testing.owed import owed_dead_letters, owed_publish, owed_rewind

PIPELINE = "orders"
TOPIC = "orders"
CLUSTER = "cluster-A"
#: one per writer: two with one cap, and one with another (a config change deployed while an older
#: run is still going): writers of one cap land the same batch, different caps fence each other
CAPS = (8, 8, 3)
WRITERS = len(CAPS)
#: how each writer decodes: the second runs a fixed decoding (see :func:`decoded`) while the first
#: still runs the old one (a rolling deploy), and both plan the same batches
DECODINGS = ("strict", "lenient", "strict")
MAX_PARTITIONS = 3
MAX_ATTEMPTS = 4
#: what befalls a commit attempt itself (:data:`ingest.testing.Fault`)
FAULTS = ("ok", "ack-lost", "unknown", "crash-before", "crash-after")
#: what happens at a commit attempt: a fault of the attempt itself, or work slipped in before it
AT_COMMIT = st.sampled_from(
    [*FAULTS, "ok", "other-writer", "foreign", "expire", "alter", "produce", "reset", "rollback", "replay"]
)
#: what happens while a writer's engine reads and once it has written its files
MEANWHILE = st.sampled_from(
    [
        *("nothing", "nothing", "other-writer", "other-writer", "crash"),
        *("foreign", "expire", "alter", "produce", "deploy", "reset", "rollback", "replay"),
    ]
)

Record = tuple[TopicPartition, int]


def kind(tp: TopicPartition, offset: int) -> str:
    """What Kafka holds at an offset: fixed, so every read of a range sees the same records."""
    k = offset + 3 * tp.partition
    if k % 5 == 4:
        return "marker"  # transaction marker or aborted record: no record to deliver
    if k % 3 == 1:
        return "bad"
    return "good"


def decoded(decoding: str, tp: TopicPartition, offset: int) -> str:
    """What a writer of ``decoding`` makes of the record at an offset: the lenient decoding (a fix
    deployed) takes half of the records the strict one sets aside as rows."""
    what = kind(tp, offset)
    return "good" if what == "bad" and decoding == "lenient" and offset % 2 == 0 else what


def _coordinates(records: list[Record], names: tuple[str, str, str]) -> pa.Table:
    return pa.table(
        {
            names[0]: pa.array([tp.topic for tp, _ in records], pa.string()),
            names[1]: pa.array([tp.partition for tp, _ in records], pa.int32()),
            names[2]: pa.array([offset for _, offset in records], pa.int64()),
        }
    )


def columns_of(version: int) -> list[str]:
    """The columns writer schema ``version`` has beyond the Kafka ones: one more per version."""
    return [f"c{v}" for v in range(1, version + 1)]


def rows_of(records: list[Record], versions: list[int]) -> pa.Table:
    """The rows of ``records``, each with the writer schema version it was written with."""
    data = _coordinates(records, ("_kafka_topic", "_kafka_partition", "_kafka_offset"))
    return data.append_column("_version", pa.array(versions, pa.int32()))


def dead_letters_of(records: list[Record]) -> pa.Table:
    return _coordinates(records, ("topic", "partition", "offset"))


ROW_COLUMNS = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
DEAD_COLUMNS = ("topic", "partition", "offset")


def contents(catalog: MemoryCatalog, columns: tuple[str, str, str], branch: str = MAIN) -> Counter[Record]:
    data = catalog.scan(branch)
    if data is None:
        return Counter()
    topic, partition, offset = (data[c].to_pylist() for c in columns)
    return Counter((TopicPartition(t, p), o) for t, p, o in zip(topic, partition, offset, strict=True))


#: the extra column of what a corruption added (so undoing it removes exactly that)
CORRUPT = "_corrupt"


@dataclass(frozen=True)
class Corruption:
    """Another tool's change to the tables after the pipeline's last commit, not undone yet."""

    #: what verify must find wrong, at which record
    kind: Problem
    record: Record
    #: copies of the record it added to (positive) or removed from (negative) each table
    rows: int = 0
    dead: int = 0


def _is(record: Record, columns: tuple[str, str, str]) -> Callable[[pa.Table], pa.Array]:
    """Which rows of a file hold ``record`` (its coordinates in ``columns``)."""
    tp, offset = record

    def at(data: pa.Table) -> pa.Array:
        where = pc.and_(pc.equal(data[columns[0]], tp.topic), pc.equal(data[columns[1]], tp.partition))
        return pc.and_(where, pc.equal(data[columns[2]], offset))

    return at


def _added_by_a_corruption(data: pa.Table) -> pa.Array:
    if CORRUPT in data.column_names:
        return pc.fill_null(data[CORRUPT], False)
    return pa.array([False] * data.num_rows, pa.bool_())


def writer_schema(version: int) -> WriterSchema:
    """Writer schema ``version`` as the registry holds it: an Avro record of ``columns_of(version)``."""
    fields = [{"name": c, "type": ["null", "string"], "default": None} for c in columns_of(version)]
    return WriterSchema(version, "AVRO", json.dumps({"type": "record", "name": "order", "fields": fields}))


def config_of(writer: int) -> PipelineConfig:
    """Writer ``writer``'s config: its cap (:data:`CAPS`); Avro values through a registry, the table
    evolving to take each writer schema (``on_schema_change: evolve``)."""
    return parse(
        {
            "pipeline": PIPELINE,
            "kafka": {"bootstrap.servers": "unused:9092"},
            "topics": [{"name": TOPIC, "format": "avro"}],
            "schema_registry": {"url": "http://unused:8081"},
            "catalog": {"name": "memory"},
            "table": "lake.orders",
            "batch": {"max_records": CAPS[writer]},
            "commit": {"max_attempts": MAX_ATTEMPTS},
        },
        "machine.yaml",
    )


class Engine:
    """The engine of writer ``writer`` (:class:`ingest.ports.Engine`): reads its batch's records from
    the model of Kafka under its decoding and writes the rows into its rows table; what happens
    around it (another writer's batch, a reset, a crash...) is drawn when it begins reading and
    once its files are written (:meth:`ProtocolMachine.meanwhile`)."""

    def __init__(self, machine: ProtocolMachine, writer: int, rows: MemoryTable) -> None:
        self.machine, self.writer, self.rows = machine, writer, rows

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        machine = self.machine
        machine.meanwhile(self.writer, "reading")
        good: list[Record] = []
        bad: list[Record] = []
        for tp, start, end in batch.ranges():
            assert end <= machine.high[tp], "planned past the readable end"
            for offset in range(start, end):
                what = decoded(DECODINGS[self.writer], tp, offset)
                {"good": good, "bad": bad, "marker": []}[what].append((tp, offset))
        versions = [machine.version_of(tp, offset) for tp, offset in good]
        # a record of a writer schema the table's fields lack: the loop evolves the table and produces again
        covered = len([f for f in fields if f.name.startswith("c")])
        ahead = sorted({v for v in versions if v > covered})
        if ahead:
            firsts: dict[TopicPartition, int] = {}
            for (tp, offset), v in zip(good, versions, strict=True):
                if v > covered:
                    firsts.setdefault(tp, offset)
            first = tuple((tp.topic, tp.partition, offset) for tp, offset in firsts.items())
            event("a batch met a writer schema the table lacks")
            raise SchemaAhead(f"records of schema id(s) {ahead}", tuple(ahead), first=first)
        files = self.rows.write(rows_of(good, versions))
        machine.meanwhile(self.writer, "written")
        return Produced(files, DeadLetterSpool.of(dead_letters_of(bad)), len(good) + len(bad), 0, {})

    def writing_to(self, rows: MemoryTable) -> Engine:
        return Engine(self.machine, self.writer, rows)

    def close(self) -> None:
        pass


def new_pipeline(machine: ProtocolMachine, writer: int) -> tuple[Pipeline[MemoryTable, MemorySource], Engine]:
    """A run of writer ``writer``: the real :class:`ingest.pipeline.Pipeline` on fresh handles."""
    rows, dead = machine.rows.table(), machine.dead.table()
    pipeline = Pipeline(config_of(writer), machine.source, rows, dead, [], machine.registry)
    return pipeline, Engine(machine, writer, rows)


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        #: Kafka (the ``high`` property: each partition's high watermark) and its Schema Registry
        self.source = MemorySource(CLUSTER)
        self.registry = MemoryRegistry()
        self.registry.register(f"{TOPIC}-value", writer_schema(0))
        #: per partition, from which offset on records carry which writer schema version
        self.deployed: dict[TopicPartition, list[tuple[int, int]]] = {}
        self.version = 0
        self.alters = 0
        self.rows = MemoryCatalog("lake.orders")
        self.dead = MemoryCatalog("lake.orders_dead_letters")
        self.rows.on_commit = self.dead.on_commit = self.at_commit
        # handles hold what they loaded for a number of clock reads, not of seconds: a run replays exactly
        self.rows.monotonic = self.dead.monotonic = ticking()
        self.writers = [new_pipeline(self, i) for i in range(WRITERS)]
        #: the Hypothesis data of the rule running now (None: commits meet no faults)
        self.data: st.DataObject | None = None
        self.depth = 0
        self.resets = 0
        self.last_reset: ResetCommand | None = None
        self.corruption: Corruption | None = None
        #: the writer whose next commit to the dead-letter table an operator's publish precedes
        self.publish_before_dead_letters: int | None = None

    # --- the writers: the real pipeline code ---------------------------------------------------

    def version_of(self, tp: TopicPartition, offset: int) -> int:
        return max((v for start, v in self.deployed.get(tp, []) if start <= offset), default=0)

    @property
    def high(self) -> dict[TopicPartition, int]:
        """Each partition's high watermark."""
        return {tp: marks.high for tp, marks in self.source.partitions.items()}

    def run_batch(self, i: int) -> bool:
        """One batch of writer ``i``: the real :meth:`ingest.pipeline.Pipeline.run_batch`; a crash, a
        commit that gave up or a batch fenced too often ends its run (the writer starts anew). False
        if there was nothing to do."""
        pipeline, engine = self.writers[i]
        try:
            result = pipeline.run_batch(engine)  # type: ignore[arg-type]
        except Crashed:
            event("a writer crashed")
        except CommitGaveUp:
            event("a commit gave up")
        except SchemaMoved:
            event("the schema moved under a batch's files")
        except Fenced:
            event("a batch was fenced too often")
        else:
            event(f"batch: {result.status}")
            return result.status != "empty"
        self.writers[i] = new_pipeline(self, i)
        return True

    def meanwhile(self, writer: int, step: str) -> None:
        """Asked as writer ``writer``'s engine begins reading and once its files are written: what
        happens meanwhile (nothing, another writer's batch, Kafka grows, a schema is deployed,
        another tool commits or alters the schema, an expiry, a reset), or the writer dies here."""
        if self.data is None:
            return
        what = self.data.draw(MEANWHILE, label=f"while {step}")
        if what == "crash":
            raise Crashed(f"the writer died while {step}")
        self.slip_in(what, writer, self.rows)

    def slip_in(self, what: str, writer: int, table: MemoryCatalog) -> None:
        """Do ``what`` while writer ``writer`` is mid-batch (``table``: the catalog it is about to commit to)."""
        assert self.data is not None
        if what == "other-writer" and self.depth == 0:
            other = self.data.draw(st.sampled_from([i for i in range(WRITERS) if i != writer]), label="slips in")
            self.depth += 1
            try:
                self.run_batch(other)
            finally:
                self.depth -= 1
        elif what == "foreign":
            self.foreign_commit_on(table, self.data.draw(st.booleans(), label="compaction"))
        elif what == "expire":
            self.expire_on(table, self.data.draw(st.integers(1, 3), label="keep last"))
        elif what == "alter":
            self.alter_schema()
        elif what == "produce":
            tp = self.data.draw(st.sampled_from(sorted(self.high)), label="partition")
            self.source.produce(tp, self.data.draw(st.integers(1, 8), label="records"))
        elif what == "deploy":
            self.deploy_writer_schema()
        elif what == "reset" and self.depth == 0 and self.corruption is None:
            self.depth += 1
            try:
                self.reset_to(self.data, self.data.draw(st.sampled_from(["earliest", "latest", "offsets"])))
            finally:
                self.depth -= 1
        elif what in ("rollback", "replay") and self.depth == 0 and self.corruption is None:
            self.depth += 1
            try:
                (self.roll_back if what == "rollback" else self.run_replay)(self.data)
            finally:
                self.depth -= 1

    def at_commit(self, table: MemoryTable) -> Fault:
        """Asked by the memory tables before every commit attempt: what befalls it, or what happens
        first (as :meth:`meanwhile`)."""
        if self.data is None:
            return "ok"
        armed = self.publish_before_dead_letters
        if armed is not None and table is self.writers[armed][0].dead and self.depth == 0:
            self.publish_before_dead_letters = None
            self.depth += 1
            try:
                self.run_replay(self.data, kept_only=True)
            finally:
                self.depth -= 1
        what = self.data.draw(AT_COMMIT, label="at commit")
        if what not in FAULTS:
            writer = next((i for i, (p, _) in enumerate(self.writers) if table in (p.rows, p.dead)), -1)
            self.slip_in(what, writer, table.catalog)
            return "ok"
        event(f"commit attempt: {what}")
        return what  # type: ignore[return-value]

    # --- what other tools do ------------------------------------------------------------------

    def foreign_commit_on(self, catalog: MemoryCatalog, compaction: bool) -> None:
        """A snapshot without this pipeline's ledger: compaction (same rows), or another pipeline."""
        if compaction:
            catalog.append({MAINTENANCE_KEY: COMPACTION}, operation="replace")
            return
        other = TopicPartition("payments", 0)
        n = len(catalog.snapshots()) + 1
        summary = encode("payments", Ledger(batch=n, offsets={other: n}), BatchCounts(records=1))
        assert decode(PIPELINE, summary) is None
        columns = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
        if catalog is self.dead:
            columns = ("topic", "partition", "offset")
        data = _coordinates([(other, n)], columns)
        catalog.append(summary, [catalog.table().write(data)[0]])  # type: ignore[list-item]

    def alter_schema(self) -> None:
        """Another tool's ``ALTER TABLE … ADD COLUMN`` on the rows table."""
        self.alters += 1
        self.rows.alter_schema(f"x{self.alters}")

    def expire_on(self, catalog: MemoryCatalog, keep_last: int) -> None:
        """``ingest maintain``'s expiry with every snapshot past the retention, planned by the core."""
        view = catalog.table()
        head = view.head()
        if head.snapshot_id is None:
            return
        refs = [Ref(name, snapshot_id, True) for name, snapshot_id in catalog.refs.items()]
        keep = protected(refs, view.ancestry, registered_pipelines(head.properties))
        gone = doomed(view.all_snapshots(), keep, keep_last, cutoff_ms=10**18)
        event(f"expiry removed snapshots: {bool(gone)}")
        catalog.expire(gone)

    def operator(self) -> Pipeline[MemoryTable, MemorySource]:
        """An operator's command's own process: the pipeline on fresh handles."""
        return Pipeline(config_of(0), self.source, self.rows.table(), self.dead.table(), [], self.registry)

    def run_reset(self, command: ResetCommand) -> None:
        """``ingest reset`` from the operator's own process (a fresh handle), every commit attempt
        meeting what Hypothesis draws; it may die, give up or be fenced by a writer's commit."""
        try:
            result = ingest_reset(self.operator(), command.target, command.reason, command.reset_id)  # type: ignore[arg-type]
            event(f"reset: {result.status}")
        except Crashed:
            event("a reset crashed during its commit")
        except CommitGaveUp:
            event("a reset gave up")
        except FatalError:
            event("a reset was fenced by a writer's commit")

    # --- rules ---------------------------------------------------------------------------------

    @initialize(highs=st.lists(st.integers(0, 12), min_size=1, max_size=MAX_PARTITIONS), batches=st.integers(0, 3))
    def a_pipeline_that_may_have_run_before(self, highs: list[int], batches: int) -> None:
        """Kafka holds some records; the pipeline may have committed a few batches without faults."""
        for p, high in enumerate(highs):
            self.source.produce(TopicPartition(TOPIC, p), high)
        for _ in range(batches):
            if not self.run_batch(0):
                break

    @rule(partition=st.integers(0, MAX_PARTITIONS - 1), n=st.integers(1, 8))
    def produce(self, partition: int, n: int) -> None:
        tp = TopicPartition(TOPIC, partition % len(self.high))
        self.source.produce(tp, n)

    @rule()
    def deploy_writer_schema(self) -> None:
        """The producing service deploys a writer schema with one more column: records produced from
        now on carry it."""
        self.version += 1
        self.registry.register(f"{TOPIC}-value", writer_schema(self.version))
        for tp, high in self.high.items():
            self.deployed.setdefault(tp, []).append((high, self.version))

    @rule()
    def another_tool_adds_a_column(self) -> None:
        self.alter_schema()

    @precondition(lambda self: len(self.high) < MAX_PARTITIONS)
    @rule(n=st.integers(0, 6))
    def add_partition(self, n: int) -> None:
        tp = TopicPartition(TOPIC, len(self.high))
        self.source.produce(tp, n)
        self.deployed[tp] = [(0, self.version)]

    @precondition(lambda self: self.corruption is None)
    @rule(data=st.data(), kind=st.sampled_from(["earliest", "latest", "offsets", "offsets"]))
    def reset(self, data: st.DataObject, kind: str) -> None:
        """An operator moves the ledger, backwards or forwards (also while a writer is mid-batch:
        :meth:`meanwhile`)."""
        self.data = data
        try:
            self.reset_to(data, kind)
        finally:
            self.data = None

    def reset_to(self, data: st.DataObject, kind: str) -> None:
        offsets = None
        if kind == "offsets":
            tps = data.draw(st.lists(st.sampled_from(sorted(self.high)), min_size=1, unique=True), label="moved")
            offsets = {tp: data.draw(st.integers(0, self.high[tp]), label=f"to, {tp}") for tp in tps}
        self.resets += 1
        target = ResetTarget(kind, offsets)  # type: ignore[arg-type]
        self.last_reset = ResetCommand(PIPELINE, target, "machine", f"reset-{self.resets}", "operator", MAX_ATTEMPTS)
        self.run_reset(self.last_reset)

    @precondition(lambda self: self.last_reset is not None and self.corruption is None)
    @rule(data=st.data())
    def run_the_last_reset_again(self, data: st.DataObject) -> None:
        """The same command again (a retry after a crash, or of one that did apply): it applies once."""
        assert self.last_reset is not None
        self.data = data
        try:
            self.run_reset(self.last_reset)
        finally:
            self.data = None

    @precondition(lambda self: self.corruption is None)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        """An operator rolls main back to a snapshot of the pipeline's (also while a writer is
        mid-batch: :meth:`meanwhile`)."""
        self.data = data
        try:
            self.roll_back(data)
        finally:
            self.data = None

    def roll_back(self, data: st.DataObject) -> None:
        """``ingest replay --rollback`` (the real :func:`ingest.ops.replay.roll_back`) from the
        operator's own process, to a snapshot with the pipeline's ledger on main's line; its commits
        meet the same faults."""
        targets = self.rollback_targets()
        if not targets:
            return
        target = data.draw(st.sampled_from(targets), label="rolls back to")
        try:
            roll_back(self.operator(), target)  # type: ignore[arg-type]
            event("rollback: applied")
        except Crashed:
            event("a rollback crashed")
        except (CommitGaveUp, MainMoved):
            event("a rollback met a moving main")
        except RollbackRefused:
            event("a rollback was refused: another pipeline first committed after its snapshot")
        except ReplayImpossible:
            event("a rollback's snapshot was expired meanwhile")

    @precondition(lambda self: self.corruption is None)
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        """An operator replays from a snapshot of the pipeline's into a branch, to compare or to publish (also
        while a writer is mid-batch: :meth:`meanwhile`)."""
        self.data = data
        try:
            self.run_replay(data)
        finally:
            self.data = None

    def kept_replays(self) -> list[int]:
        """The snapshots of the replays whose branch is kept (compared, or one that died or was refused)."""
        return sorted(int(ref.removeprefix("replay-")) for ref in self.rows.refs if ref.startswith("replay-"))

    @precondition(lambda self: self.corruption is None and self.kept_replays())
    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1))
    def publish_while_a_batch_owes_its_dead_letters(self, data: st.DataObject, writer: int) -> None:
        """A writer's batch whose first commit to the dead-letter table (its own dead letters, once
        its rows and marker landed; or the settle of the marker it builds on) meets an operator
        publishing a kept replay first: whatever marker main then leaves behind is owed nothing."""
        self.data = data
        self.publish_before_dead_letters = writer
        try:
            self.run_batch(writer)
        finally:
            self.data = None
            self.publish_before_dead_letters = None

    def run_replay(self, data: st.DataObject, *, kept_only: bool = False) -> None:
        """``ingest replay``, to compare or with ``--publish`` (the real :func:`ingest.ops.replay.replay`:
        a command run again continues its branch) from the operator's own process, with the decoding of one of the
        writers, from a snapshot with the pipeline's ledger on main's line; its commits meet the same
        faults, its batches what happens around a writer's."""
        targets = self.rollback_targets()
        # a replay whose branch is kept (compared, or one that died or was refused) run again: it
        # continues the branch, and publishes it (the operator's next step, or an orchestrator's retry)
        kept = self.kept_replays()
        again = bool(kept) and (kept_only or data.draw(st.booleans(), label="a kept replay again, to publish"))
        targets = kept if again else targets
        if not targets:
            return
        target = data.draw(st.sampled_from(targets), label="replays from")
        writer = data.draw(st.integers(0, WRITERS - 1), label="with the decoding of writer")
        operator = Pipeline(config_of(writer), self.source, self.rows.table(), self.dead.table(), [], self.registry)
        run = Run(operator, Engine(self, writer, operator.rows))  # type: ignore[arg-type]
        publish = again or data.draw(st.booleans(), label="publish")  # else: a replay to compare, its branch kept
        try:
            ingest_replay(run, target, publish=publish)
            event(f"replay: {'published' if publish else 'replayed'}")
        except Crashed:
            event("a replay crashed")
        except (CommitGaveUp, MainMoved, Fenced, SchemaMoved, BranchGone):
            event("a replay met a moving main")
        except (PublishRefused, ReplayImpossible, ConfigError) as error:
            event(f"a replay was refused: {type(error).__name__}")

    def rollback_targets(self) -> list[int]:
        """The snapshots with the pipeline's ledger on main's line, but those whose rollback would
        discard a batch that read records the snapshot's own line had read: after a backward reset,
        a batch of another decoding may set aside records the line had read as rows, and no rewind
        by offsets tells those dead letters from the line's (a known gap: the rollback should bring
        the dead-letter table back to its snapshot of the line instead,
        ``test_rollback_race.test_a_rollback_over_a_reread_of_another_decoding_keeps_no_dead_letter_of_it``)."""
        targets: list[int] = []
        left_out = False
        discarded: list[tuple[TopicPartition, int, int]] = []  # what the batches after a snapshot read
        for snap in self.rows.table().ancestry():
            ledger = decode(PIPELINE, snap.summary)
            if ledger is None:
                continue
            line = carried_reads(ledger)
            if not any(lo < end and start < hi for tp, start, end in discarded for lo, hi in line.get(tp, ())):
                targets.append(snap.snapshot_id)
            else:
                left_out = True
            if ledger.reset_id is None and read_extra(PIPELINE, snap.summary, "restamped-by") is None:
                discarded += [(tp, ledger.start_offsets.get(tp, end), end) for tp, end in ledger.offsets.items()]
        if left_out:
            event("a rollback target left out: it would discard a re-read (a known gap)")
        return targets

    @precondition(lambda self: self.corruption is None)
    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1))
    def a_batch(self, data: st.DataObject, writer: int) -> None:
        """A batch of a writer (the real loop: plan, read, write, commit, planned again when fenced),
        with what Hypothesis draws happening around its steps and at every commit attempt."""
        self.data = data
        try:
            self.run_batch(writer)
        finally:
            self.data = None

    @rule(table=st.sampled_from(["rows", "dead"]), compaction=st.booleans())
    def foreign_commit(self, table: str, compaction: bool) -> None:
        self.foreign_commit_on(self.rows if table == "rows" else self.dead, compaction)

    @precondition(lambda self: self.corruption is None)
    @rule(table=st.sampled_from(["rows", "dead"]), keep_last=st.integers(1, 3))
    def expire(self, table: str, keep_last: int) -> None:
        self.expire_on(self.rows if table == "rows" else self.dead, keep_last)

    # (not while a publish owes its dead-letter step: another tool's delete on the dead-letter
    # table's main then stops the runs until an operator applies it to the branch too, a known gap:
    # `test_rollback_race.test_a_delete_on_the_dead_letters_while_a_publish_owes_them_stops_the_runs_...`)
    @precondition(lambda self: self.corruption is None and owed_publish(self.rows, self.dead, PIPELINE) is None)
    @rule(
        data=st.data(),
        how=st.sampled_from(
            ["delete a row", "append a row past the ledger", "copy a row", "copy a dead letter", "both"]
        ),
    )
    def another_tool_corrupts_a_table(self, data: st.DataObject, how: str) -> None:
        """Another tool changes a table after the pipeline's last commit so that it is wrong: the
        record picked is one whose wrongness verify can tell (it is in the range verify checks, and
        a row deleted or added is no dead letter that a reset had read again)."""
        found = find_ledger(PIPELINE, self.rows.table().ancestry())
        if found is None:
            return
        claims = coverage(PIPELINE, self.rows.table().ancestry())
        checked = self.checked(found.ledger.offsets, claims)
        if not checked:
            return
        rows, dead, owed = contents(self.rows, ROW_COLUMNS), contents(self.dead, DEAD_COLUMNS), self.owed()

        def within(record: Record) -> bool:
            tp, offset = record
            return tp in checked and checked[tp][0] <= offset < checked[tp][1]

        def reads(record: Record) -> int:
            tp, offset = record
            return int(expected_reads(pa.array([offset], pa.int64()), claims, tp, found.ledger.offsets[tp])[0].as_py())

        corruptions: list[Corruption] = []
        if how == "delete a row":
            corruptions = [
                Corruption("missing", r, rows=-n) for r, n in rows.items() if within(r) and not dead[r] + owed[r]
            ]
        elif how == "append a row past the ledger":
            tp = data.draw(st.sampled_from(sorted(checked)), label="partition")
            past = (tp, checked[tp][1] + data.draw(st.integers(0, 3), label="past the ledger by"))
            corruptions = [Corruption("unexpected", past, rows=1)]
        elif how == "copy a row":
            corruptions = [Corruption("duplicated", r, rows=1) for r in rows if within(r) and not dead[r] + owed[r]]
        elif how == "copy a dead letter":
            corruptions = [
                Corruption("duplicated_dead_letters", d, dead=1)
                for d in dead
                if d[0] in checked and d[1] < checked[d[0]][1]
            ]
        else:
            corruptions = [
                Corruption("in_both_tables", r, dead=1)
                for r, n in rows.items()
                if within(r) and n == 1 and not dead[r] + owed[r] and reads(r) == 1
            ] + [
                Corruption("in_both_tables", d, rows=1)
                for d in dead + owed
                if within(d) and not rows[d] and reads(d) <= 1
            ]
        corruptions = [c for c in corruptions if c.record[0].topic == TOPIC]
        event(f"corruption: {how}{'' if corruptions else ', nothing to corrupt'}")
        if not corruptions:
            return
        self.corruption = corruption = data.draw(st.sampled_from(sorted(corruptions, key=repr)), label="corruption")
        for catalog, delta, columns in self.changed_by(corruption):
            if delta > 0:
                added = _coordinates([corruption.record] * delta, columns).append_column(
                    CORRUPT, pa.array([True] * delta)
                )
                catalog.append({}, catalog.table().write(added))  # type: ignore[arg-type]
            elif delta < 0:
                catalog.delete({}, _is(corruption.record, columns))

    @precondition(lambda self: self.corruption is not None)
    @rule()
    def the_corruption_is_undone(self) -> None:
        self.undo_corruption()

    def undo_corruption(self) -> None:
        """Another tool puts back what the corruption removed, and removes what it added."""
        corruption = self.corruption
        assert corruption is not None
        for catalog, delta, columns in self.changed_by(corruption):
            if delta > 0:
                catalog.delete({}, _added_by_a_corruption)
            elif delta < 0:
                catalog.append({}, catalog.table().write(_coordinates([corruption.record] * -delta, columns)))  # type: ignore[arg-type]
        self.corruption = None

    def changed_by(self, corruption: Corruption) -> list[tuple[MemoryCatalog, int, tuple[str, str, str]]]:
        """Each table, with how many copies of the record ``corruption`` added to it (or removed)."""
        return [(self.rows, corruption.rows, ROW_COLUMNS), (self.dead, corruption.dead, DEAD_COLUMNS)]

    def checked(self, ledger: Mapping[TopicPartition, int], claims: Coverage) -> dict[TopicPartition, tuple[int, int]]:
        """Per partition of the ledger, the offsets verify checks: ``[start, top)``."""
        return {
            tp: (claims.lowest(tp, end), max(end, min(claims.top(tp, end), self.high[tp])))
            for tp, end in ledger.items()
        }

    # --- invariants ----------------------------------------------------------------------------

    def history(self) -> tuple[Counter[Record], set[Record], Counter[Record], Counter[Record]]:
        """From every snapshot ever committed to the rows table's main (in order: it is one line):
        how many times the pipeline's batches read each offset, the offsets a forward reset
        skipped, and how many times each record was read as a row and as poison (by the decoding
        of the batch that landed). On the way: each batch starts where the ledger before it ended
        (else a batch landed twice, or left a gap), and no reset landed twice."""
        reads: Counter[Record] = Counter()
        as_row: Counter[Record] = Counter()
        as_poison: Counter[Record] = Counter()
        skipped: set[Record] = set()
        resets: set[str] = set()
        ledger: dict[TopicPartition, int] = {}
        for snap in self.main_line():
            new = decode(PIPELINE, snap.summary)
            if new is None:
                continue
            if read_extra(PIPELINE, snap.summary, "restamped-by") is not None:
                assert dict(new.offsets) == ledger, f"a restamp moved the ledger from {ledger} to {new.offsets}"
                continue
            if new.reset_id is None:
                decoding = self.decoding_of(ledger, new, decode_counts(PIPELINE, snap.summary))
                for tp, end in new.offsets.items():
                    start = ledger.get(tp, 0)
                    assert new.start_offsets.get(tp, start) == start, (
                        f"batch {new.batch} of {tp} does not start at {start}"
                    )
                    assert start <= end
                    reads.update((tp, o) for o in range(start, end))
                for tp, end in new.offsets.items():
                    start = ledger.get(tp, 0)
                    for o in range(start, end):
                        what = decoded(decoding, tp, o)
                        if what != "marker":
                            (as_row if what == "good" else as_poison)[(tp, o)] += 1
            else:
                assert new.reset_id not in resets, f"reset {new.reset_id} landed twice"
                resets.add(new.reset_id)
                for tp, to in new.offsets.items():
                    skipped.update((tp, o) for o in range(ledger.get(tp, 0), to))
            ledger = dict(new.offsets)
        return reads, skipped, as_row, as_poison

    def main_line(self) -> list[MemorySnapshot]:
        """The snapshots of main's line, oldest first: from main's head back through every parent
        (expired ones too: the catalog's log keeps them). A rollback's restamp is a child of the
        snapshot it went back to, so what main left behind is not on it."""
        snapshots = {snap.snapshot_id: snap for _, snap in self.rows.log}
        line: list[MemorySnapshot] = []
        at = self.rows.head()
        while at is not None:
            line.append(snapshots[at])
            at = snapshots[at].parent_id
        return line[::-1]

    def decoding_of(self, before: Mapping[TopicPartition, int], batch: Ledger, counts: BatchCounts) -> str:
        """The decoding of the writer that landed ``batch`` (read from ``before`` on), told by the dead
        letters its summary counts: where both decodings set the same records aside, either."""
        bad = {
            decoding: sum(
                decoded(decoding, tp, o) == "bad"
                for tp, end in batch.offsets.items()
                for o in range(before.get(tp, 0), end)
            )
            for decoding in ("strict", "lenient")
        }
        assert counts.dead_letters in bad.values(), f"batch {batch.batch} counts {counts}, its range decodes to {bad}"
        return "strict" if counts.dead_letters == bad["strict"] else "lenient"

    @invariant()
    def every_offset_is_where_the_ledger_history_put_it(self) -> None:
        found = find_ledger(PIPELINE, self.rows.table().ancestry())
        ledger = dict(found.ledger.offsets) if found else {}
        floor_found = find_ledger(PIPELINE, self.dead.table().ancestry())
        floor = dict(floor_found.ledger.offsets) if floor_found else {}
        rows, dead = self.as_the_pipeline_left_them()
        published = owed_publish(self.rows, self.dead, PIPELINE)
        if published is not None:  # a publish's rows step landed, its dead-letter step not yet
            dead = contents(self.dead, DEAD_COLUMNS, published)
            on_branch = find_ledger(PIPELINE, self.dead.table(published).ancestry())
            floor = dict(on_branch.ledger.offsets) if on_branch else {}
        rewind = owed_rewind(self.rows, self.dead, PIPELINE)
        if rewind is not None:  # a rollback's rows step landed, its dead-letter step not yet
            to, gaps = rewind
            dead = Counter(
                {
                    (tp, o): n
                    for (tp, o), n in dead.items()
                    if tp.topic != TOPIC or (o < to.get(tp, 0) and not any(lo <= o < hi for lo, hi in gaps.get(tp, ())))
                }
            )
            floor = dict(to)
        owed = self.owed()
        reads, skipped, as_row, as_poison = self.history()

        for record in {*rows, *reads}:
            tp, offset = record
            if tp.topic != TOPIC:
                continue  # another pipeline's records
            assert rows[record] == as_row[record], (
                f"{tp}@{offset} ({kind(tp, offset)}) is {rows[record]} times in the rows, read as a row "
                f"{as_row[record]} times"
            )
        for (tp, offset), n in dead.items():
            if tp.topic != TOPIC:
                continue
            assert n == 1, f"dead letter {tp}@{offset} is {n} times in the dead-letter table"
            assert as_poison[(tp, offset)], f"{tp}@{offset} is a dead letter, no landed batch read it as one"
            assert offset < floor.get(tp, 0), f"dead letter {tp}@{offset} is at or above the floor"
        for record, n in owed.items():
            assert n == 1 and not dead[record], f"{record} owed as a dead letter twice"
            assert as_poison[record], f"{record} owed as a dead letter, no landed batch read it as one"
        for record in as_poison:
            assert dead[record] + owed[record] == 1, f"{record} was read as poison, it is no dead letter"
        for tp, end in floor.items():
            for offset in range(end):
                if kind(tp, offset) != "marker" and (tp, offset) not in skipped:
                    assert reads[(tp, offset)], f"{tp}@{offset} is below the floor, no batch read it"
        for tp, end in ledger.items():
            assert end <= self.high[tp]
        if found is not None:
            assert PIPELINE in registered_pipelines(self.rows.properties)

    def as_the_pipeline_left_them(self) -> tuple[Counter[Record], Counter[Record]]:
        """The records in the rows and the dead-letter table, the corruption (if any) taken out."""
        rows, dead = contents(self.rows, ROW_COLUMNS), contents(self.dead, DEAD_COLUMNS)
        if self.corruption is not None:
            rows[self.corruption.record] -= self.corruption.rows
            dead[self.corruption.record] -= self.corruption.dead
        return +rows, +dead

    def owed(self) -> Counter[Record]:
        """The dead letters a crash between a batch's two commits left in files, for the next run."""
        owed = owed_dead_letters(self.rows, self.dead, PIPELINE)
        if owed is None:
            return Counter()
        return Counter(
            (TopicPartition(t, p), o) for t, p, o in zip(*(owed[c].to_pylist() for c in DEAD_COLUMNS), strict=True)
        )

    @invariant()
    def verify_finds_the_tables_wrong_exactly_while_they_are(self) -> None:
        """``ingest verify`` reasons from the ledger history the tables keep (expiry included): it
        must expect what the batches did, whatever resets came between them, and find the tables
        as they are: correct, or the corrupted record wrong, in the way it is."""
        found = find_ledger(PIPELINE, self.rows.table().ancestry())
        if found is None:
            assert self.corruption is None
            return
        claims = coverage(PIPELINE, self.rows.table().ancestry())
        rows = contents(self.rows, ROW_COLUMNS)
        published = owed_publish(self.rows, self.dead, PIPELINE)  # (its dead-letter step: the branch)
        dead = contents(self.dead, DEAD_COLUMNS, published or MAIN) + self.owed()

        def offsets(tp: TopicPartition, landed: Counter[Record]) -> pa.Array:
            return pa.array([o for (t, o), n in sorted(landed.items()) if t == tp for _ in range(n)], pa.int64())

        for tp, (start, top) in self.checked(found.ledger.offsets, claims).items():
            kafka = pa.array([o for o in range(start, top) if kind(tp, o) != "marker"], pa.int64())
            end = found.ledger.offsets[tp]
            check = judge_partition((tp, start, top), end, kafka, offsets(tp, rows), offsets(tp, dead), claims)
            corrupted = self.corruption is not None and self.corruption.record[0] == tp
            wrong = {self.corruption.kind: [self.corruption.record[1]]} if self.corruption and corrupted else {}
            assert check.found == wrong, f"verify: {check}; the corruption: {self.corruption}"

    @invariant()
    def schema_and_data_land_together(self) -> None:
        """No rows without the columns of their schema, and no schema change of the pipeline's own
        without a batch of its: every file is written with the columns of its rows, every snapshot's
        schema gives each file's columns the field ids the file has, and where the pipeline's
        columns grow, the snapshot carries the pipeline's ledger. The schema is the table's, not a
        branch's (a replay's batch evolves it on its branch; a rollback leaves it as it is): each
        snapshot is compared with the one committed before it, on whatever branch."""
        before: list[str] = []
        for _, snapshot in self.rows.log:
            for f in snapshot.files:
                if "_version" in f.data.column_names and f.data.num_rows:
                    needed = columns_of(max(f.data["_version"].to_pylist()))
                    assert set(needed) <= set(f.schema), f"{f.file_path} was written without {needed}"
                # column identity is the field id (the position): a file's columns are the table's
                assert snapshot.schema[: len(f.schema)] == f.schema, f"{f.file_path}'s field ids are another's"
            ours = [c for c in snapshot.schema if c.startswith("c")]
            if ours != before:
                assert decode(PIPELINE, snapshot.summary) is not None, "the schema changed in a snapshot of no batch"
            before = ours
        assert [c for c in self.rows.schema if c.startswith("c")] == before, "the schema changed with no snapshot"

    def teardown(self) -> None:
        """With the faults gone, one writer catches up with Kafka: the protocol never stalls."""
        self.data = None
        if self.corruption is not None:
            self.undo_corruption()
        self.writers = [new_pipeline(self, i) for i in range(WRITERS)]
        for _ in range(1000):
            if not self.run_batch(0):
                break
        else:  # (a batch that ends early for its schema, or is fenced, still moves the ledger)
            raise AssertionError("a fault-free writer did not catch up")
        found = find_ledger(PIPELINE, self.rows.table().ancestry())
        assert found is not None and dict(found.ledger.offsets) == self.high
        self.every_offset_is_where_the_ledger_history_put_it()
        self.verify_finds_the_tables_wrong_exactly_while_they_are()


@pytest.fixture(autouse=True)
def _no_backoff() -> Iterator[None]:
    with without_backoff():  # the machine makes thousands of commit attempts
        yield


ProtocolMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocol = ProtocolMachine.TestCase
