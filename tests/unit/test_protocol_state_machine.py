"""The exactly-once protocol as a Hypothesis state machine, driven by the real pure core.

Models, in memory:

* Kafka: a few partitions whose high watermark grows when ``produce`` fires (partitions can be
  added). Whether an offset holds a good record, a bad (poison) record or no record at all (a
  transaction marker / aborted record: offsets are not contiguous) is a fixed function of the offset.
* Two tables (rows and dead letters), each a list of snapshots with a summary and the records it
  added, with compare-and-swap append: a commit names the head snapshot it observed and is refused
  if the head moved.
* Up to three writers of the same pipeline, each stepping through plan -> read -> commit dead
  letters -> commit rows, every step a separate rule so they interleave. Commits are split into
  "observe" and "apply" so other writers can slip in between. Writers crash at any step, lose
  commit acknowledgements (the commit is applied, the writer sees an error and re-observes, as
  ``ingest/committer.py`` does) and are fenced (they plan again, as ``Pipeline.run_batch`` does).
  Foreign commits (compaction, another pipeline) land on either table at any time, and so does
  snapshot expiry as ``ingest maintain`` plans it (``ingest.core.expiry``). Two writers are
  copies of one deployment (same cap: they land identical batches), the third has another cap (so
  writers planned from the same ledger fence each other). The pipeline may have committed a few
  batches before the faults start.

The commit logic mirrors ``ingest/committer.py`` (``commit_rows`` / ``commit_dead_letters``) and calls
the real ``find_ledger``, ``plan_batch``, ``decide``, ``dead_letter_step``, ``encode``/``decode``.

Invariant after every step: every offset below the rows ledger is in the rows table (good records)
or the dead-letter table (bad records) exactly once, and nothing at or above it is in the rows table;
no dead letter is duplicated, and the dead-letter floor holds (every bad record below it is in the
dead-letter table, nothing at or above it is). At the end, a fault-free writer drains Kafka and the
ledger reaches every high watermark: nothing stalls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest.core.commit import Decision, dead_letter_step, decide
from ingest.core.expiry import MAIN, Ref, doomed, protected
from ingest.core.ledger import (
    BatchCounts,
    Found,
    Ledger,
    SnapshotView,
    TopicPartition,
    decode,
    encode,
    find_ledger,
    register,
    registered_pipelines,
)
from ingest.core.plan import Batch, KafkaView, PlanPolicy, Watermarks, plan_batch

PIPELINE = "orders"
TOPIC = "orders"
CLUSTER = "cluster-A"
#: one per writer: two copies of one deployment, and one with another cap (a config change deployed
#: while an older run is still going): copies land the same batch, different caps fence each other
POLICIES = [PlanPolicy(start="earliest", on_data_loss="fail", max_records=n) for n in (8, 8, 3)]
WRITERS = len(POLICIES)
MAX_PARTITIONS = 3
#: how a commit attempt ends: applied and acknowledged, applied but the acknowledgement was lost
#: (timeout, 5xx), or refused without being applied
OUTCOMES = st.sampled_from(["ok", "ack-lost", "failed"])

Record = tuple[TopicPartition, int]


def kind(tp: TopicPartition, offset: int) -> str:
    """What Kafka holds at an offset: fixed, so every read of a range sees the same records."""
    k = offset + 3 * tp.partition
    if k % 5 == 4:
        return "marker"  # transaction marker or aborted record: no record to deliver
    if k % 3 == 1:
        return "bad"
    return "good"


class Conflict(Exception):
    """The catalog refused the commit: the head is no longer the snapshot the writer required."""


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    summary: dict[str, str]
    added: tuple[Record, ...]


@dataclass
class Table:
    name: str
    snapshots: list[Snapshot] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    #: snapshots removed by expiry: their records stay (later snapshots reference the same files),
    #: but the walk back from the head ends at one, as Iceberg clears a survivor's parent link
    expired: set[int] = field(default_factory=set)

    def head(self) -> int | None:
        return self.snapshots[-1].snapshot_id if self.snapshots else None

    def ancestry(self) -> list[SnapshotView]:
        views = []
        for s in reversed(self.snapshots):
            if s.snapshot_id in self.expired:
                break
            views.append(SnapshotView(s.snapshot_id, s.summary, timestamp_ms=s.snapshot_id))
        return views

    def live(self) -> list[SnapshotView]:
        return [
            SnapshotView(s.snapshot_id, s.summary, s.snapshot_id)
            for s in self.snapshots
            if s.snapshot_id not in self.expired
        ]

    def observe(self) -> tuple[int | None, Found | None]:
        """Like ``committer.observe``: the head and its ledger, failing closed on a lost ledger."""
        found = find_ledger(PIPELINE, self.ancestry())
        assert not (found is None and PIPELINE in registered_pipelines(self.properties)), "ledger lost"
        return self.head(), found

    def try_commit(self, required_head: int | None, snapshot_id: int, summary: dict[str, str], added, props) -> None:
        if self.head() != required_head:
            raise Conflict(f"{self.name}: head is {self.head()}, the commit required {required_head}")
        self.snapshots.append(Snapshot(snapshot_id, summary, tuple(added)))
        self.properties.update(props)

    def contents(self) -> Counter[Record]:
        return Counter(r for s in self.snapshots for r in s.added)


@dataclass(eq=False)  # writers are told apart by identity
class Writer:
    """One running copy of the pipeline; everything here is lost when it crashes."""

    phase: str = "idle"  # idle -> planned -> read -> rows -> idle
    batch: Batch | None = None
    good: list[Record] = field(default_factory=list)
    dead: list[Record] = field(default_factory=list)
    #: commit_dead_letters' ``written_for``: the floor the dead-letter files were filtered for
    written_for: tuple[dict[TopicPartition, int], list[Record]] | None = None
    #: an observed dead-letter commit, waiting to be applied: (head, summary, records, properties)
    dead_pending: tuple[int | None, dict[str, str], list[Record], dict[str, str]] | None = None
    #: the rows head was observed with a COMMIT decision; the commit waits to be applied on it
    rows_observed: bool = False
    rows_head: int | None = None


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.high: dict[TopicPartition, int] = {}
        self.rows = Table("rows")
        self.dead = Table("dead letters")
        self.writers = [Writer() for _ in range(WRITERS)]
        self.next_snapshot_id = 1000

    # --- helpers -------------------------------------------------------------------------------

    def new_snapshot_id(self) -> int:
        self.next_snapshot_id += 1
        return self.next_snapshot_id

    def kafka(self) -> KafkaView:
        return KafkaView(CLUSTER, {tp: Watermarks(0, high) for tp, high in self.high.items()})

    def writers_in(self, phase: str) -> list[int]:
        return [i for i, w in enumerate(self.writers) if w.phase == phase]

    def plan(self, w: Writer) -> bool:
        """``Pipeline.plan`` and the empty-batch check of ``Pipeline._attempt``; False if empty."""
        i = self.writers.index(w)
        _, found = self.rows.observe()
        batch = plan_batch(found.ledger if found else None, self.kafka(), POLICIES[i])
        for tp, high in self.high.items():
            assert batch.start[tp] <= batch.end[tp] <= high
        assert batch.planned_records <= POLICIES[i].max_records
        self.writers[i] = w = Writer()
        if batch.moves_ledger:
            w.phase, w.batch = "planned", batch
        return batch.moves_ledger

    def read(self, w: Writer) -> None:
        assert w.batch is not None
        for tp, start, end in w.batch.ranges():
            assert end <= self.high[tp], "planned past the readable end"
            for offset in range(start, end):
                {"good": w.good, "bad": w.dead, "marker": []}[kind(tp, offset)].append((tp, offset))
        w.phase = "read"

    def observe_dead_letters(self, w: Writer) -> None:
        """One attempt of ``committer.commit_dead_letters`` up to ``try_commit``."""
        assert w.batch is not None
        if not w.dead:
            w.phase = "rows"
            return
        head, found = self.dead.observe()
        step = dead_letter_step(found.ledger if found else None, w.batch)
        if w.written_for is None or w.written_for[0] != step.floor:
            # committer._above_floor: drop dead letters below the floor of their partition
            kept = [(tp, o) for tp, o in w.dead if not (tp in step.floor and o < step.floor[tp])]
            assert kept == [d for d in w.dead if step.keeps(*d)]
            w.written_for = (dict(step.floor), kept)
        _, kept = w.written_for
        if not kept:
            event("dead letters: all already below the floor")
            w.phase = "rows"
            return
        ledger = Ledger(
            batch=(found.ledger.batch + 1) if found else 1,
            offsets=step.new_floor,
            start_offsets=w.batch.start,
            cluster_id=w.batch.cluster_id,
        )
        summary = encode(PIPELINE, ledger, BatchCounts(dead_letters=len(kept)))
        w.dead_pending = (head, summary, kept, register(self.dead.properties, PIPELINE))

    def apply_dead_letters(self, w: Writer, outcome: str) -> None:
        assert w.dead_pending is not None
        head, summary, kept, props = w.dead_pending
        w.dead_pending = None
        if outcome == "failed":  # not applied, outcome unknown to the writer: observe again
            return
        try:
            self.dead.try_commit(head, self.new_snapshot_id(), summary, kept, props)
        except Conflict:
            event("dead letters: conflict")
            return
        if outcome == "ack-lost":  # applied, but the writer saw an error: observe again
            return
        w.phase = "rows"

    def observe_rows(self, w: Writer) -> None:
        """One attempt of ``committer.commit_rows`` up to ``try_commit``; fenced batches re-plan."""
        assert w.batch is not None
        head, found = self.rows.observe()
        decision = decide(found.ledger if found else None, w.batch)
        event(f"rows: {decision.value}")
        if decision is Decision.COMMIT:
            w.rows_observed, w.rows_head = True, head
        elif decision is Decision.LANDED:
            self.writers[self.writers.index(w)] = Writer()
        else:
            self.plan(w)

    def apply_rows(self, w: Writer, outcome: str) -> None:
        assert w.batch is not None and w.rows_observed
        head, w.rows_observed = w.rows_head, False
        batch = w.batch
        ledger = Ledger(
            batch=batch.number,
            offsets=batch.end,
            start_offsets=batch.start,
            cluster_id=batch.cluster_id,
            lost=batch.lost,
        )
        summary = encode(PIPELINE, ledger, BatchCounts(records=len(w.good), dead_letters=len(w.dead)))
        if outcome == "failed":
            return
        try:
            self.rows.try_commit(
                head, self.new_snapshot_id(), summary, w.good, register(self.rows.properties, PIPELINE)
            )
        except Conflict:
            event("rows: conflict")
            return
        if outcome == "ack-lost":
            return
        self.writers[self.writers.index(w)] = Writer()

    def step(self, w: Writer, outcome: str) -> None:
        """One step of a writer: plan, read, observe or apply a commit (``outcome`` for applies)."""
        if w.phase == "idle":
            self.plan(w)
        elif w.phase == "planned":
            self.read(w)
        elif w.phase == "read" and w.dead_pending is None:
            self.observe_dead_letters(w)
        elif w.phase == "read":
            self.apply_dead_letters(w, outcome)
        elif not w.rows_observed:
            self.observe_rows(w)
        else:
            self.apply_rows(w, outcome)

    def run_batch(self, i: int) -> bool:
        """One whole batch of writer ``i`` without faults; False if there was nothing to do."""
        if not self.plan(self.writers[i]):
            return False
        for _ in range(100):
            if self.writers[i].phase == "idle":
                return True
            self.step(self.writers[i], "ok")
        raise AssertionError("a fault-free batch did not finish")

    # --- rules ---------------------------------------------------------------------------------

    @initialize(highs=st.lists(st.integers(0, 12), min_size=1, max_size=MAX_PARTITIONS), batches=st.integers(0, 3))
    def a_pipeline_that_may_have_run_before(self, highs: list[int], batches: int) -> None:
        """Kafka holds some records; the pipeline may have committed a few batches without faults."""
        self.high = {TopicPartition(TOPIC, p): high for p, high in enumerate(highs)}
        for _ in range(batches):
            if not self.run_batch(0):
                break

    @rule(partition=st.integers(0, MAX_PARTITIONS - 1), n=st.integers(1, 8))
    def produce(self, partition: int, n: int) -> None:
        tp = TopicPartition(TOPIC, partition % len(self.high))
        self.high[tp] += n

    @precondition(lambda self: len(self.high) < MAX_PARTITIONS)
    @rule(n=st.integers(0, 6))
    def add_partition(self, n: int) -> None:
        self.high[TopicPartition(TOPIC, len(self.high))] = n

    @precondition(lambda self: self.writers_in("idle"))
    @rule(data=st.data())
    def plan_batch(self, data) -> None:
        i = data.draw(st.sampled_from(self.writers_in("idle")), label="writer")
        self.plan(self.writers[i])

    @precondition(lambda self: self.writers_in("planned"))
    @rule(data=st.data())
    def read_batch(self, data) -> None:
        i = data.draw(st.sampled_from(self.writers_in("planned")), label="writer")
        self.read(self.writers[i])

    @precondition(lambda self: self.writers_in("read"))
    @rule(data=st.data(), outcome=OUTCOMES)
    def commit_dead_letters(self, data, outcome: str) -> None:
        """Observe the dead-letter ledger, or apply the commit observed earlier (two steps)."""
        i = data.draw(st.sampled_from(self.writers_in("read")), label="writer")
        self.step(self.writers[i], outcome)

    @precondition(lambda self: self.writers_in("rows"))
    @rule(data=st.data(), outcome=OUTCOMES)
    def commit_rows(self, data, outcome: str) -> None:
        """Observe the rows ledger and decide, or apply the commit observed earlier (two steps)."""
        i = data.draw(st.sampled_from(self.writers_in("rows")), label="writer")
        self.step(self.writers[i], outcome)

    @rule(writer=st.integers(0, WRITERS - 1), outcome=OUTCOMES)
    def advance(self, writer: int, outcome: str) -> None:
        """The next step of any writer, whatever its phase.

        Hypothesis disables a random subset of rules in each example (swarm testing); without this
        rule, a writer would rarely find all of the stage rules above enabled and get anywhere.
        """
        self.step(self.writers[writer], outcome)

    @precondition(lambda self: any(w.phase != "idle" for w in self.writers))
    @rule(data=st.data())
    def crash(self, data) -> None:
        busy = [i for i, w in enumerate(self.writers) if w.phase != "idle"]
        i = data.draw(st.sampled_from(busy), label="writer")
        self.writers[i] = Writer()

    @rule(table=st.sampled_from(["rows", "dead"]), what=st.sampled_from(["compaction", "other-pipeline"]))
    def foreign_commit(self, table: str, what: str) -> None:
        """A snapshot without this pipeline's ledger: compaction (same records), or another pipeline."""
        target = self.rows if table == "rows" else self.dead
        if what == "compaction":
            summary = {"operation": "replace", "added-data-files": "1", "deleted-data-files": "4"}
            added: tuple[Record, ...] = ()
        else:
            other = TopicPartition("payments", 0)
            n = len(target.snapshots)
            summary = encode("payments", Ledger(batch=n + 1, offsets={other: n + 1}), BatchCounts(records=1))
            added = ((other, n),)
            assert decode(PIPELINE, summary) is None
        target.snapshots.append(Snapshot(self.new_snapshot_id(), summary, added))

    @rule(table=st.sampled_from(["rows", "dead"]), keep_last=st.integers(1, 3))
    def expire(self, table: str, keep_last: int) -> None:
        """``ingest maintain``'s expiry with every snapshot past the retention, planned by the real
        core (between any two steps of the writers: their pending commits then find a moved or a
        kept head)."""
        target = self.rows if table == "rows" else self.dead
        head = target.head()
        if head is None:
            return
        keep = protected([Ref(MAIN, head, True)], lambda _: target.ancestry(), registered_pipelines(target.properties))
        gone = doomed(target.live(), keep, keep_last, cutoff_ms=10**18)
        event(f"expiry removed snapshots: {bool(gone)}")
        target.expired |= set(gone)

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_offset_below_the_ledger_lands_exactly_once(self) -> None:
        found = find_ledger(PIPELINE, self.rows.ancestry())
        ledger = dict(found.ledger.offsets) if found else {}
        floor_found = find_ledger(PIPELINE, self.dead.ancestry())
        floor = dict(floor_found.ledger.offsets) if floor_found else {}
        rows = self.rows.contents()
        dead = self.dead.contents()

        for (tp, offset), n in rows.items():
            if tp.topic != TOPIC:
                continue  # another pipeline's records
            assert n == 1, f"{tp}@{offset} is {n} times in the rows table"
            assert kind(tp, offset) == "good", f"{tp}@{offset} ({kind(tp, offset)}) is in the rows table"
            assert offset < ledger.get(tp, 0), f"{tp}@{offset} is in the rows table at or above the ledger"
        for (tp, offset), n in dead.items():
            if tp.topic != TOPIC:
                continue
            assert n == 1, f"dead letter {tp}@{offset} is {n} times in the dead-letter table"
            assert kind(tp, offset) == "bad", f"{tp}@{offset} ({kind(tp, offset)}) is a dead letter"
            assert offset < floor.get(tp, 0), f"dead letter {tp}@{offset} is at or above the floor"
        for tp, end in ledger.items():
            assert end <= self.high[tp]
            for offset in range(end):
                expected = kind(tp, offset)
                assert rows[(tp, offset)] == (expected == "good"), f"rows table: {tp}@{offset} ({expected})"
                assert dead[(tp, offset)] == (expected == "bad"), f"dead letters: {tp}@{offset} ({expected})"
        for tp, end in floor.items():
            assert all(dead[(tp, o)] == 1 for o in range(end) if kind(tp, o) == "bad"), f"floor of {tp}"
        if found is not None:
            assert PIPELINE in registered_pipelines(self.rows.properties)

    def teardown(self) -> None:
        """With the faults gone, one writer catches up with Kafka: the protocol never stalls."""
        self.writers = [Writer() for _ in range(WRITERS)]
        for _ in range(1000):
            if not self.run_batch(0):
                break
        else:
            raise AssertionError("a fault-free writer did not catch up")
        found = find_ledger(PIPELINE, self.rows.ancestry())
        assert found is not None and dict(found.ledger.offsets) == self.high
        self.every_offset_below_the_ledger_lands_exactly_once()


ProtocolMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocol = ProtocolMachine.TestCase
