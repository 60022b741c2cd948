"""Changelog pipelines (``changes:``) as a Hypothesis state machine driving the real batch loop.

Three runs of the real :class:`ingest.pipeline.Pipeline` with ``changes: {envelope: debezium, key:
[id]}`` (caps 4, 4 and 2: writers of one cap land the same batches, the other fences them) commit
to in-memory tables (:mod:`ingest.testing`) the Debezium change events of a two-partition topic, a
key's events always in partition ``key mod 2``. Their engine reads each batch's values from the
machine's model of Kafka and produces it as every engine does, through the real decoder and fold
(:func:`ingest.engines.tasks.decode_and_write`): the row delta's keys and each key's newest row.

What the machine varies: the changes produced (creates, updates, an update that moves a row to
another key, deletes each followed by Debezium's tombstone, poison events); as an engine begins
reading and once its files are written, another writer's whole batch or the writer's death; at
every commit attempt, a fault (applied, acknowledgement lost, refused with an unknown outcome, the
process dying before or after it is applied) or another writer's batch first.

After every step the rows table on main is the fold of exactly the committed changes: every key
whose newest change below the ledger's offsets upserts has one row, that change's image at that
change's Kafka coordinates, and no other key has a row (a model fold written here, apart from
:mod:`ingest.changes`); and ``ingest verify``'s judgement of a changelog
(:func:`ingest.changes_check.judge`, on the changes decoded as the pipeline decodes them) finds
nothing wrong. At the end a fault-free writer drains Kafka, and each poison event is a dead
letter exactly once.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ingest.changes_check import judge
from ingest.config import PipelineConfig, parse
from ingest.core.ledger import TopicPartition
from ingest.core.ledger_codec import find_ledger
from ingest.core.plan import Batch
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import decode_and_write
from ingest.errors import CommitGaveUp, Fenced
from ingest.pipeline import Pipeline
from ingest.ports import Produced
from ingest.progress import Advanced
from ingest.records import ROWS, Declared, RawChunk
from ingest.retry import without_backoff
from ingest.testing.memory_kafka import MemorySource
from ingest.testing.memory_state import Crashed, Fault
from ingest.testing.memory_table import MemoryCatalog, MemoryTable

PIPELINE, TOPIC = "customers", "customers"
PARTITIONS = [TopicPartition(TOPIC, p) for p in range(2)]
CAPS = (4, 4, 2)
WRITERS = len(CAPS)
#: the keys of a partition: ``p``, ``p + 2``, ``p + 4``
KEYS_PER_PARTITION = 3
FAULTS = ("ok", "ok", "ack-lost", "unknown", "crash-before", "crash-after")
AT_COMMIT = st.sampled_from([*FAULTS, "other-writer"])
MEANWHILE = st.sampled_from(["nothing", "nothing", "other-writer", "crash"])
CHANGE = st.tuples(st.integers(0, KEYS_PER_PARTITION - 1), st.sampled_from(["c", "u", "u", "d", "move", "poison"]))
POISON = [b"{not json", b'{"before": null, "after": {"v": "no key"}, "op": "c"}', b'{"op": "t"}']
T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)

#: a record's value in the model: a Debezium event, a tombstone (None), or poison
Value = bytes | None


def config_of(writer: int) -> PipelineConfig:
    return parse(
        {
            "pipeline": PIPELINE,
            "kafka": {"bootstrap.servers": "unused:9092"},
            "topics": [{"name": TOPIC, "format": "json"}],
            "catalog": {"name": "memory"},
            "table": "lake.customers",
            "schema": [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}],
            "changes": {"envelope": "debezium", "key": ["id"]},
            "batch": {"max_records": CAPS[writer]},
            "commit": {"max_attempts": 4},
        },
        "machine.yaml",
    )


def debezium(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op, "source": {}}).encode()


def chunk(tp: TopicPartition, start: int, values: Sequence[Value]) -> RawChunk:
    """Kafka's records ``start..`` of ``tp`` as a read returns them."""
    n = len(values)
    offsets = list(range(start, start + n))
    return RawChunk(
        topic=pa.array([tp.topic] * n, pa.string()),
        partition=pa.array([tp.partition] * n, pa.int32()),
        offset=pa.array(offsets, pa.int64()),
        timestamp=pa.array([T0 + dt.timedelta(seconds=o) for o in offsets], pa.timestamp("us", tz="UTC")),
        key=pa.array([None] * n, pa.binary()),
        values=list(values),
        headers=lambda i: None,
        nbytes=sum(len(v or b"") for v in values),
    )


class Engine:
    """Writer ``writer``'s engine: reads the batch's values from the model of Kafka and produces
    them through the real decoder and fold, into its rows table."""

    def __init__(self, machine: ChangelogMachine, writer: int, rows: MemoryTable) -> None:
        self.machine, self.writer, self.rows = machine, writer, rows

    def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
        self.machine.meanwhile(self.writer, "reading")
        spec = TaskSpec.of(config_of(self.writer), fields)
        assert spec.changes is not None
        chunks = [chunk(tp, start, self.machine.log[tp][start:end]) for tp, start, end in batch.ranges() if end > start]
        produced = decode_and_write(chunks, spec.decoder(), self.rows, 1_000, key=spec.changes[1])
        self.machine.meanwhile(self.writer, "written")
        return produced

    def writing_to(self, rows: MemoryTable) -> Engine:
        return Engine(self.machine, self.writer, rows)

    def close(self) -> None:
        pass


class ChangelogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.source = MemorySource("cluster-A")
        #: Kafka: each partition's values, by offset
        self.log: dict[TopicPartition, list[Value]] = {tp: [] for tp in PARTITIONS}
        for tp in PARTITIONS:
            self.source.produce(tp, 0)
        self.rows = MemoryCatalog("lake.customers")
        self.dead = MemoryCatalog("lake.customers_dead_letter")
        self.rows.on_commit = self.dead.on_commit = self.at_commit
        self.writers = [self.new_pipeline(i) for i in range(WRITERS)]
        self.data: st.DataObject | None = None
        self.depth = 0
        #: the producer's view of each key's row (an update's ``before`` image)
        self.current: dict[int, dict[str, Any]] = {}

    def new_pipeline(self, writer: int) -> tuple[Pipeline[MemoryTable, MemorySource], Engine]:
        rows, dead = self.rows.table(), self.dead.table()
        return Pipeline(config_of(writer), self.source, rows, dead), Engine(self, writer, rows)

    def run_batch(self, i: int) -> bool:
        """One batch of writer ``i`` (the real loop); a crash or a run that gave up starts it anew.
        False if there was nothing to do."""
        pipeline, engine = self.writers[i]
        try:
            result = pipeline.run_batch(engine)  # type: ignore[arg-type]
        except Crashed:
            event("a writer crashed")
        except (CommitGaveUp, Fenced) as error:
            event(f"a run ended: {type(error).__name__}")
        else:
            event(f"batch: {result.status}")
            return result.status != "empty"
        self.writers[i] = self.new_pipeline(i)
        return True

    def slip_in(self, writer: int) -> None:
        assert self.data is not None
        if self.depth > 0:
            return
        other = self.data.draw(st.sampled_from([i for i in range(WRITERS) if i != writer]), label="slips in")
        self.depth += 1
        try:
            self.run_batch(other)
        finally:
            self.depth -= 1

    def meanwhile(self, writer: int, step: str) -> None:
        if self.data is None:
            return
        what = self.data.draw(MEANWHILE, label=f"while {step}")
        if what == "crash":
            raise Crashed(f"the writer died while {step}")
        if what == "other-writer":
            self.slip_in(writer)

    def at_commit(self, table: MemoryTable) -> Fault:
        if self.data is None:
            return "ok"
        what = self.data.draw(AT_COMMIT, label="at commit")
        if what == "other-writer":
            writer = next((i for i, (p, _) in enumerate(self.writers) if table in (p.rows, p.dead)), -1)
            self.slip_in(writer)
            return "ok"
        event(f"commit attempt: {what}")
        return what  # type: ignore[return-value]

    # --- rules ---------------------------------------------------------------------------------

    @rule(partition=st.integers(0, len(PARTITIONS) - 1), changes=st.lists(CHANGE, min_size=1, max_size=6))
    def produce(self, partition: int, changes: list[tuple[int, str]]) -> None:
        """Debezium's events of some changes to keys of ``partition``: creates and updates of
        ``after`` images, an update that moves a row from another key, deletes (then Debezium's
        tombstone), and now and then a poison event."""
        tp = PARTITIONS[partition]
        values: list[Value] = []
        for k, op in changes:
            key = partition + 2 * k
            after = {"id": key, "v": f"{partition}:{len(self.log[tp]) + len(values)}"}
            if op == "poison":
                values.append(POISON[len(self.log[tp]) % len(POISON)])
            elif op == "d":
                values += [debezium("d", self.current.pop(key, {"id": key, "v": None}), None), None]
            elif op == "move":
                old = partition + 2 * ((k + 1) % KEYS_PER_PARTITION)
                values.append(debezium("u", self.current.pop(old, {"id": old, "v": None}), after))
                self.current[key] = after
            else:
                values.append(debezium(op, self.current.get(key), after))
                self.current[key] = after
        self.log[tp] += values
        self.source.produce(tp, len(values))

    @rule(data=st.data(), writer=st.integers(0, WRITERS - 1))
    def a_batch(self, data: st.DataObject, writer: int) -> None:
        self.data = data
        try:
            self.run_batch(writer)
        finally:
            self.data = None

    # --- invariants ----------------------------------------------------------------------------

    def committed(self) -> dict[TopicPartition, int]:
        found = find_ledger(PIPELINE, self.rows.table().ancestry())
        return dict(found.ledger.offsets) if found is not None else {}

    def fold(self, offsets: dict[TopicPartition, int]) -> dict[int, tuple[int, int, str]]:
        """The model: each live key's (partition, offset, ``v``) after the changes below ``offsets``."""
        rows: dict[int, tuple[int, int, str]] = {}
        for tp, end in offsets.items():
            for offset, value in enumerate(self.log[tp][:end]):
                try:
                    change = json.loads(value) if value is not None else None
                except ValueError:
                    continue
                if not isinstance(change, dict) or change.get("op") not in ("c", "u", "d"):
                    continue
                before, after = change["before"], change["after"]
                if before is not None and (after is None or before["id"] != after["id"]):
                    rows.pop(before["id"], None)
                if after is not None and after.get("id") is not None:
                    rows[after["id"]] = (tp.partition, offset, after["v"])
        return rows

    @invariant()
    def the_table_is_the_fold_of_the_committed_changes(self) -> None:
        offsets = self.committed()
        data = self.rows.scan()
        stored = data.select(["id", ROWS.partition, ROWS.offset, "v"]).to_pylist() if data is not None else []
        ids = Counter(r["id"] for r in stored)
        assert all(n == 1 for n in ids.values()), f"a key has two rows: {ids}"
        table = {r["id"]: (r[ROWS.partition], r[ROWS.offset], r["v"]) for r in stored}
        assert table == self.fold(offsets)
        if data is None or not offsets:
            return
        # verify's judgement, on the committed changes decoded as the pipeline decodes them
        pipeline, _ = self.writers[0]
        spec = TaskSpec.of(config_of(0), pipeline.fields)
        decoder = spec.decoder()
        changes = pa.concat_tables(
            [decoder.decode(chunk(tp, 0, self.log[tp][:end])).rows for tp, end in offsets.items() if end > 0]
        )
        everything = pa.array([True] * data.num_rows, pa.bool_())
        check = judge(changes, data, everything, ("id",))
        assert check.ok, check

    def teardown(self) -> None:
        """With the faults gone, one writer drains Kafka; every poison event is a dead letter once."""
        self.data = None
        self.writers = [self.new_pipeline(i) for i in range(WRITERS)]
        for _ in range(1000):
            if not self.run_batch(0):
                break
        else:
            raise AssertionError("a fault-free writer did not catch up")
        if any(self.log.values()):
            assert self.committed() == {tp: len(values) for tp, values in self.log.items()}
        self.the_table_is_the_fold_of_the_committed_changes()
        dead = self.dead.scan()
        stored = Counter(zip(dead["partition"].to_pylist(), dead["offset"].to_pylist(), strict=True)) if dead else {}
        poison = {
            (tp.partition, offset)
            for tp, values in self.log.items()
            for offset, value in enumerate(values)
            if value is not None and value in POISON
        }
        assert dict(stored) == dict.fromkeys(poison, 1)


@pytest.fixture(autouse=True)
def _no_backoff() -> Iterator[None]:
    with without_backoff():
        yield


ChangelogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestChangelog = ChangelogMachine.TestCase
