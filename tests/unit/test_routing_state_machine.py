"""``route_by`` as a Hypothesis state machine driving the real commit code of several tables.

Each writer runs a batch as :meth:`ingest.pipeline.Pipeline._attempt` does with ``route_by``, on
in-memory tables (:mod:`ingest.testing`): it plans from the ledger's table
(:func:`ingest.committer.observe`, :func:`ingest.core.plan.plan_batch`), reads the routed tables'
floors and cuts its rows at them (the real :meth:`ingest.pipeline.Routes.read_floors` and
:class:`ingest.route_by.writing.RoutedTables`), commits its dead letters
(:func:`ingest.committer.commit_dead_letters`), then each routed table
(:meth:`ingest.pipeline.Routes.commit`, :func:`ingest.committer.commit_floor`), then the ledger
(:func:`ingest.committer.commit_rows`, no files), and plans again when fenced or when a floor moved.

What the machine varies: Kafka's partitions and their high watermarks; where each record goes (a
fixed function of its offset: table ``a``, table ``b``, a dead letter, or no record at all); three
writers of one pipeline, two copies of one deployment and one with another cap; and at every
commit attempt a fault drawn by Hypothesis: applied, acknowledgement lost, an unknown outcome, the
process dying before or after the commit applies, or another writer's step slipped in first (so a
copy commits between any writer's observation and its commit, also between two tables' commits).

Invariants after every step: no record is in any table twice, each is only in the table it
routes to; every record a committed ledger range covers is in its table (or the dead letters, or
the files of the dead letters the ledger's marker still owes) exactly once; each routed table
holds every record routed to it below its floor. At the end a fault-free writer drains Kafka and
every record is in place exactly once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest.batch_commit import BatchCommit, commit_batch, land_dead_letters
from ingest.committer import observe
from ingest.config import parse
from ingest.core.ledger import BatchCounts, TopicPartition, find_ledger
from ingest.core.plan import Batch, KafkaView, PlanPolicy, Watermarks, plan_batch
from ingest.errors import CommitGaveUp
from ingest.records import ROUTE_COLUMN
from ingest.retry import without_backoff
from ingest.route_by.tables import Routes
from ingest.testing import Crashed, Fault, MemoryCatalog, MemoryTable, owed_dead_letters

PIPELINE = "events"
TOPIC = "events"
CLUSTER = "cluster-A"
TABLES = ("lake.events_a", "lake.events_b")
POLICIES = [PlanPolicy(start="earliest", on_data_loss="fail", max_records=n) for n in (8, 8, 3)]
WRITERS = len(POLICIES)
MAX_PARTITIONS = 3
MAX_ATTEMPTS = 4
AT_COMMIT = st.sampled_from(["ok", "ok", "ack-lost", "unknown", "crash-before", "crash-after", "other-writer"])
CONFIG = parse(
    {
        "pipeline": PIPELINE,
        "kafka": {"bootstrap.servers": "unused:9092"},
        "topics": [TOPIC],
        "catalog": {"name": "lake"},
        "schema": [{"name": "kind", "type": "string"}],
        "route_by": {"field": "kind", "table": "lake.events_{value}", "allow": ["a", "b"]},
        "commit": {"max_attempts": MAX_ATTEMPTS},
    }
)

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


@dataclass(eq=False)
class Writer:
    """One running copy of the pipeline; everything here is lost when it crashes."""

    ledger: MemoryTable
    dead: MemoryTable
    routes: Routes
    phase: str = "idle"  # idle -> planned -> read -> idle
    batch: Batch | None = None
    files: list = field(default_factory=list)  # type: ignore[type-arg]
    bad: list[Record] = field(default_factory=list)


class RoutingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.high: dict[TopicPartition, int] = {}
        self.ledger = MemoryCatalog("lake.events_ledger")
        self.dead = MemoryCatalog("lake.events_dead_letter")
        self.tables = {name: MemoryCatalog(name) for name in TABLES}
        for catalog in (self.ledger, self.dead, *self.tables.values()):
            catalog.on_commit = self.at_commit
        self.writers = [self.new_writer() for _ in range(WRITERS)]
        self.data: st.DataObject | None = None
        self.depth = 0

    def new_writer(self) -> Writer:
        handles = {name: catalog.table() for name, catalog in self.tables.items()}
        routes = Routes(CONFIG, None, handles)  # type: ignore[arg-type]  # (its layout creates tables; none here)
        return Writer(self.ledger.table(), self.dead.table(), routes)

    def kafka(self) -> KafkaView:
        return KafkaView(CLUSTER, {tp: Watermarks(0, high) for tp, high in self.high.items()})

    # --- a writer's steps: the real code of a routed batch ------------------------------------------

    def plan(self, i: int, held: bool) -> None:
        w = self.writers[i]
        found = observe(w.ledger, PIPELINE, math.inf if held else 0.0)
        batch = plan_batch(found.ledger if found else None, self.kafka(), POLICIES[i])
        w.batch, w.files, w.bad = batch, [], []
        w.phase = "planned" if batch.moves_ledger else "idle"

    def read(self, w: Writer) -> None:
        """What its base owes first (as ``Pipeline._attempt``), then the engine's part: rows marked
        with their tables, written cut at the floors read now."""
        assert w.batch is not None
        if w.batch.base is not None:
            land_dead_letters(w.dead, w.ledger, PIPELINE, w.batch.base, MAX_ATTEMPTS)
        w.routes.read_floors(w.batch)
        good: list[tuple[TopicPartition, int, str]] = []
        for tp, start, end in w.batch.ranges():
            for offset in range(start, end):
                where = kind(tp, offset)
                if where == "dead":
                    w.bad.append((tp, offset))
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
        w.files = w.routes.tables.for_task().write(rows) if good else []
        w.phase = "read"

    def commit(self, i: int) -> None:
        """``commit_batch``: dead letters staged, each routed table, the ledger, the dead letters."""
        w = self.writers[i]
        assert w.batch is not None
        dead = pa.table(
            {
                DEAD[0]: pa.array([tp.topic for tp, _ in w.bad], pa.string()),
                DEAD[1]: pa.array([tp.partition for tp, _ in w.bad], pa.int32()),
                DEAD[2]: pa.array([offset for _, offset in w.bad], pa.int64()),
            }
        )
        counts = BatchCounts(records=sum(f.record_count for f in w.files), dead_letters=len(w.bad))
        request = BatchCommit(PIPELINE, w.batch, w.batch.ledger(), w.files, dead, counts, MAX_ATTEMPTS)
        committed = commit_batch(w.ledger, w.dead, request, w.routes)
        if committed is None:
            event("fenced, or a floor moved under a batch's files: planned again")
            self.plan(i, held=False)
        else:
            event(f"ledger: {committed.decision.value}")
            w.phase = "idle"

    def step(self, i: int, held: bool = False) -> None:
        w = self.writers[i]
        try:
            if w.phase == "idle":
                self.plan(i, held)
            elif w.phase == "planned":
                self.read(w)
            else:
                self.commit(i)
        except Crashed:
            event("a writer crashed during a commit")
            self.writers[i] = self.new_writer()
        except CommitGaveUp:
            event("a commit gave up")
            self.writers[i] = self.new_writer()

    def at_commit(self, table: MemoryTable) -> Fault:
        if self.data is None:
            return "ok"
        what = self.data.draw(AT_COMMIT, label="at commit")
        if what == "other-writer":
            if self.depth == 0:
                others = [
                    i for i, w in enumerate(self.writers) if table not in (w.ledger, w.dead, *w.routes.handles.values())
                ]
                other = self.data.draw(st.sampled_from(others), label="slips in")
                self.depth += 1
                try:
                    self.step(other)
                finally:
                    self.depth -= 1
            return "ok"
        event(f"commit attempt: {what}")
        return what  # type: ignore[return-value]

    # --- rules -----------------------------------------------------------------------------------

    @initialize(highs=st.lists(st.integers(0, 12), min_size=1, max_size=MAX_PARTITIONS))
    def kafka_holds_some_records(self, highs: list[int]) -> None:
        self.high = {TopicPartition(TOPIC, p): high for p, high in enumerate(highs)}

    @rule(partition=st.integers(0, MAX_PARTITIONS - 1), n=st.integers(1, 8))
    def produce(self, partition: int, n: int) -> None:
        self.high[TopicPartition(TOPIC, partition % len(self.high))] += n

    @precondition(lambda self: len(self.high) < MAX_PARTITIONS)
    @rule(n=st.integers(0, 6))
    def add_partition(self, n: int) -> None:
        self.high[TopicPartition(TOPIC, len(self.high))] = n

    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1), held=st.booleans())
    def advance(self, data: st.DataObject, writer: int, held: bool) -> None:
        self.data = data
        try:
            self.step(writer, held)
        finally:
            self.data = None

    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1))
    def a_whole_batch(self, data: st.DataObject, writer: int) -> None:
        self.data = data
        try:
            for _ in range(10):
                self.step(writer)
                if self.writers[writer].phase == "idle":
                    break
        finally:
            self.data = None

    @precondition(lambda self: any(w.phase != "idle" for w in self.writers))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        busy = [i for i, w in enumerate(self.writers) if w.phase != "idle"]
        self.writers[data.draw(st.sampled_from(busy), label="crashes")] = self.new_writer()

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
        self.writers = [self.new_writer() for _ in range(WRITERS)]
        for _ in range(1000):
            self.plan(0, held=False)
            if self.writers[0].phase == "idle":
                break
            for _ in range(100):
                self.step(0)
                if self.writers[0].phase == "idle":
                    break
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
