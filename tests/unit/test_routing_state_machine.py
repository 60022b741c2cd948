"""``route_by`` as a Hypothesis state machine driving the real batch loop over several tables.

Each writer is a run of the real :class:`ingest.pipeline.Pipeline` with ``route_by``
(:meth:`~ingest.pipeline.Pipeline.run_batch`) on in-memory tables (:mod:`ingest.testing`): it plans
from the ledger's table, settles what the ledger it builds on owes the dead-letter table, decides
which routed tables take rows and reads their floors (the real :class:`ingest.route_by.tables.Routes`),
has the engine write the rows cut at those floors (the real :class:`ingest.route_by.writing.RoutedTables`),
creates the tables records first name and produces the batch again, commits each routed table with
its floor, then the ledger with the marker of its dead letters, then the dead letters
(:func:`ingest.batch_commit.commit_batch`), and plans again when fenced or when a floor moved.
Nothing of the loop is mirrored here.

What the machine varies: Kafka's partitions and their high watermarks; where each record goes (a
fixed function of its offset: table ``a``, table ``b``, a dead letter, or no record at all); three
writers of one pipeline, two copies of one deployment and one with another cap; as a writer's
engine begins reading and once its files are written, another writer's batch, records produced,
or the writer dying there; and at every commit attempt a fault drawn by Hypothesis: applied,
acknowledgement lost, an unknown outcome, the process dying before or after the commit applies, or
another writer's batch slipped in first (so a copy commits between any writer's observation and
its commit, also between two tables' commits). The routed tables do not exist until records first
name them: copies race to create them.

Invariants after every step: no record is in any table twice, each is only in the table it
routes to; every record a committed ledger range covers is in its table (or the dead letters, or
the files of the dead letters the ledger's marker still owes) exactly once; each routed table
holds every record routed to it below its floor. At the end a fault-free writer drains Kafka and
every record is in place exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest.config import PipelineConfig, parse
from ingest.core.ledger import TopicPartition
from ingest.core.ledger_codec import find_ledger
from ingest.core.plan import Batch
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.errors import CommitGaveUp, Fenced
from ingest.pipeline import Pipeline
from ingest.ports import Produced, RoutedTable
from ingest.progress import Advanced
from ingest.records import ROUTE_COLUMN, Declared
from ingest.retry import without_backoff
from ingest.route_by.tables import Routes
from ingest.route_by.writing import RoutedTables
from ingest.testing.memory_kafka import MemorySource
from ingest.testing.memory_state import Crashed, Fault, ticking
from ingest.testing.memory_table import MemoryCatalog, MemoryTable
from ingest.testing.owed import owed_dead_letters

PIPELINE = "events"
TOPIC = "events"
CLUSTER = "cluster-A"
TABLES = ("lake.events_a", "lake.events_b")
CAPS = (8, 8, 3)
WRITERS = len(CAPS)
MAX_PARTITIONS = 3
MAX_ATTEMPTS = 4
AT_COMMIT = st.sampled_from(["ok", "ok", "ack-lost", "unknown", "crash-before", "crash-after", "other-writer"])
#: what happens while a writer's engine reads and once it has written its files
MEANWHILE = st.sampled_from(["nothing", "nothing", "other-writer", "other-writer", "crash", "produce"])
Record = tuple[TopicPartition, int]


def kind(tp: TopicPartition, offset: int) -> str:
    """Where the record at an offset goes: fixed, so every read of a range sees the same."""
    k = offset + 3 * tp.partition
    if k % 7 == 6:
        return "marker"  # transaction marker or aborted record: no record to deliver
    if k % 5 == 4:
        return "dead"
    return TABLES[0] if k % 3 else TABLES[1]


def contents(catalog: MemoryCatalog, columns: tuple[str, str, str]) -> Counter[Record]:
    data = catalog.scan()
    if data is None:
        return Counter()
    topic, partition, offset = (data[c].to_pylist() for c in columns)
    return Counter((TopicPartition(t, p), o) for t, p, o in zip(topic, partition, offset, strict=True))


ROWS = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
DEAD = ("topic", "partition", "offset")


def config_of(writer: int) -> PipelineConfig:
    return parse(
        {
            "pipeline": PIPELINE,
            "kafka": {"bootstrap.servers": "unused:9092"},
            "topics": [TOPIC],
            "catalog": {"name": "lake"},
            "schema": [{"name": "kind", "type": "string"}],
            "route_by": {"field": "kind", "table": "lake.events_{value}", "allow": ["a", "b"]},
            "batch": {"max_records": CAPS[writer]},
            "commit": {"max_attempts": MAX_ATTEMPTS},
        }
    )


class Maker:
    """``route_by``'s tables in memory (:class:`ingest.ports.TableMaker`): created as records first
    name them; every one takes the pipeline's rows."""

    def __init__(self, machine: RoutingMachine) -> None:
        self.machine = machine

    def open(self, name: str, fields: Sequence[Declared]) -> MemoryTable:
        event(f"a routed table opened ({'there' if name in self.machine.tables else 'created'})")
        return self.machine.table(name).table()

    def misfit(self, table: RoutedTable, fields: Sequence[Declared]) -> str | None:
        return None


class Engine:
    """Writer ``writer``'s engine (:class:`ingest.ports.Engine`): the rows of its batch, each marked
    with the table it routes to, written through the pipeline's routed tables (cut at their floors;
    the tables that do not exist yet reported missing)."""

    def __init__(self, machine: RoutingMachine, writer: int, target: RoutedTables) -> None:
        self.machine, self.writer, self.target = machine, writer, target

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        self.machine.meanwhile(self.writer, "reading")
        good: list[tuple[TopicPartition, int, str]] = []
        bad: list[Record] = []
        for tp, start, end in batch.ranges():
            for offset in range(start, end):
                where = kind(tp, offset)
                if where == "dead":
                    bad.append((tp, offset))
                elif where != "marker":
                    good.append((tp, offset, where))
        rows = pa.table(
            {
                ROWS[0]: pa.array([tp.topic for tp, _, _ in good], pa.string()),
                ROWS[1]: pa.array([tp.partition for tp, _, _ in good], pa.int32()),
                ROWS[2]: pa.array([offset for _, offset, _ in good], pa.int64()),
                ROUTE_COLUMN: pa.array([table for _, _, table in good], pa.string()),
            }
        )
        task = self.target.for_task()
        files = task.write(rows) if good else []
        self.machine.meanwhile(self.writer, "written")
        dead = pa.table(
            {
                DEAD[0]: pa.array([tp.topic for tp, _ in bad], pa.string()),
                DEAD[1]: pa.array([tp.partition for tp, _ in bad], pa.int32()),
                DEAD[2]: pa.array([offset for _, offset in bad], pa.int64()),
            }
        )
        return Produced(files, DeadLetterSpool.of(dead), len(good) + len(bad), 0, {}, missing=frozenset(task.missing))

    def close(self) -> None:
        pass


class RoutingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.source = MemorySource(CLUSTER)  # Kafka: the ``high`` property is each partition's high watermark
        self.ledger = MemoryCatalog("lake.events_ledger")
        self.dead = MemoryCatalog("lake.events_dead_letter")
        #: the routed tables, as records first name them
        self.tables: dict[str, MemoryCatalog] = {}
        # handles hold what they loaded for a number of clock reads, not of seconds: a run replays exactly
        self.clock = ticking()
        for catalog in (self.ledger, self.dead):
            catalog.on_commit = self.at_commit
            catalog.monotonic = self.clock
        self.writers = [self.new_writer(i) for i in range(WRITERS)]
        self.data: st.DataObject | None = None
        self.depth = 0

    def table(self, name: str) -> MemoryCatalog:
        assert name in TABLES, name
        if name not in self.tables:
            self.tables[name] = MemoryCatalog(name)
            self.tables[name].on_commit = self.at_commit
            self.tables[name].monotonic = self.clock
        return self.tables[name]

    def new_writer(self, i: int) -> tuple[Pipeline[MemoryTable, MemorySource], Engine]:
        """A run of writer ``i`` on fresh handles: it opens the routed tables there are."""
        config = config_of(i)
        routes = Routes(config, Maker(self), {name: catalog.table() for name, catalog in self.tables.items()})
        pipeline = Pipeline(config, self.source, self.ledger.table(), self.dead.table(), config.schema_, None, routes)
        return pipeline, Engine(self, i, routes.tables)

    @property
    def high(self) -> dict[TopicPartition, int]:
        """Each partition's high watermark."""
        return {tp: marks.high for tp, marks in self.source.partitions.items()}

    def run_batch(self, i: int) -> bool:
        """One batch of writer ``i`` (the real loop); a crash or a commit that gave up ends its run.
        False if there was nothing to do."""
        pipeline, engine = self.writers[i]
        try:
            result = pipeline.run_batch(engine)  # type: ignore[arg-type]
        except Crashed:
            event("a writer crashed")
        except CommitGaveUp:
            event("a commit gave up")
        except Fenced:
            event("a batch was fenced too often")
        else:
            event(f"ledger: {result.status}")
            return result.status != "empty"
        self.writers[i] = self.new_writer(i)
        return True

    def meanwhile(self, writer: int, step: str) -> None:
        """What happens as writer ``writer``'s engine begins reading and once its files are written."""
        if self.data is None:
            return
        what = self.data.draw(MEANWHILE, label=f"while {step}")
        if what == "crash":
            raise Crashed(f"the writer died while {step}")
        self.slip_in(what, writer)

    def slip_in(self, what: str, writer: int) -> None:
        assert self.data is not None
        if what == "other-writer" and self.depth == 0:
            other = self.data.draw(st.sampled_from([i for i in range(WRITERS) if i != writer]), label="slips in")
            self.depth += 1
            try:
                self.run_batch(other)
            finally:
                self.depth -= 1
        elif what == "produce":
            tp = self.data.draw(st.sampled_from(sorted(self.high)), label="partition")
            self.source.produce(tp, self.data.draw(st.integers(1, 8), label="records"))

    @staticmethod
    def handles_of(pipeline: Pipeline[MemoryTable, MemorySource]) -> list[object]:
        routed = pipeline.routes.handles.values() if pipeline.routes is not None else ()
        return [pipeline.rows, pipeline.dead, *routed]

    def at_commit(self, table: MemoryTable) -> Fault:
        if self.data is None:
            return "ok"
        what = self.data.draw(AT_COMMIT, label="at commit")
        if what == "other-writer":
            writer = next((i for i, (p, _) in enumerate(self.writers) if table in self.handles_of(p)), -1)
            self.slip_in(what, writer)
            return "ok"
        event(f"commit attempt: {what}")
        return what  # type: ignore[return-value]

    # --- rules -----------------------------------------------------------------------------------

    @initialize(highs=st.lists(st.integers(0, 12), min_size=1, max_size=MAX_PARTITIONS))
    def kafka_holds_some_records(self, highs: list[int]) -> None:
        for p, high in enumerate(highs):
            self.source.produce(TopicPartition(TOPIC, p), high)

    @rule(partition=st.integers(0, MAX_PARTITIONS - 1), n=st.integers(1, 8))
    def produce(self, partition: int, n: int) -> None:
        self.source.produce(TopicPartition(TOPIC, partition % len(self.high)), n)

    @precondition(lambda self: len(self.high) < MAX_PARTITIONS)
    @rule(n=st.integers(0, 6))
    def add_partition(self, n: int) -> None:
        self.source.produce(TopicPartition(TOPIC, len(self.high)), n)

    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1))
    def a_batch(self, data: st.DataObject, writer: int) -> None:
        """A batch of a writer (the real loop), with what Hypothesis draws happening around its
        steps and at every commit attempt."""
        self.data = data
        try:
            self.run_batch(writer)
        finally:
            self.data = None

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def each_record_is_at_most_once_and_only_where_it_routes(self) -> None:
        for name, catalog in self.tables.items():
            held = contents(catalog, ROWS)
            assert all(n == 1 for n in held.values()), f"{name} holds a record twice: {held.most_common(1)}"
            assert all(kind(tp, offset) == name for tp, offset in held), f"{name} holds another table's record"
        dead = contents(self.dead, DEAD)
        assert all(n == 1 for n in dead.values()), "a dead letter is in twice"
        assert all(kind(tp, offset) == "dead" for tp, offset in dead)

    @invariant()
    def every_record_the_ledger_covers_is_in_place_and_each_floor_holds(self) -> None:
        found = find_ledger(PIPELINE, self.ledger.table().ancestry())
        covered = dict(found.ledger.offsets) if found is not None else {}
        held = {name: contents(catalog, ROWS) for name, catalog in self.tables.items()}
        held["dead"] = contents(self.dead, DEAD)
        owed = owed_dead_letters(self.ledger, self.dead, PIPELINE)
        if owed is not None:  # a batch landed and its dead letters are not added yet: in files
            for t, p, o in zip(*(owed[c].to_pylist() for c in DEAD), strict=True):
                held["dead"][(TopicPartition(t, p), o)] += 1
        for tp, end in covered.items():
            for offset in range(end):
                where = kind(tp, offset)
                if where != "marker":
                    assert held[where][(tp, offset)] == 1, f"{tp}@{offset} ({where}) is missing below the ledger"
        for name, catalog in self.tables.items():
            floor = find_ledger(PIPELINE, catalog.table().ancestry())
            for tp, at in (floor.ledger.offsets if floor is not None else {}).items():
                for offset in range(at):
                    if kind(tp, offset) == name:
                        assert held[name][(tp, offset)] == 1, f"{name} lacks {tp}@{offset} below its floor"

    def teardown(self) -> None:
        """With the faults gone, one writer catches up with Kafka: every record in place once."""
        self.data = None
        self.writers = [self.new_writer(i) for i in range(WRITERS)]
        for _ in range(1000):
            if not self.run_batch(0):
                break
        else:
            raise AssertionError("a fault-free writer did not catch up")
        found = find_ledger(PIPELINE, self.ledger.table().ancestry())
        assert found is not None or not any(self.high.values())
        assert found is None or dict(found.ledger.offsets) == self.high
        self.each_record_is_at_most_once_and_only_where_it_routes()
        self.every_record_the_ledger_covers_is_in_place_and_each_floor_holds()


@pytest.fixture(autouse=True)
def _no_backoff() -> Iterator[None]:
    with without_backoff():
        yield


RoutingMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRouting = RoutingMachine.TestCase
