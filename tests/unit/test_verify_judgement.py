"""``ingest verify``'s judgement of one partition (:func:`ingest.ops.verify.judge_partition`): every kind of
wrong table it must reject, each naming its offsets, and the right tables it must accept."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ingest.batch_commit import BatchCommit, commit_batch
from ingest.committer import observe
from ingest.config import parse
from ingest.core.coverage import Coverage
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition
from ingest.core.ledger_codec import COMPACTION, MAINTENANCE_KEY, encode
from ingest.core.plan import KafkaView, PlanPolicy, Watermarks, plan_batch
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.ops.blame import change_points
from ingest.ops.verify import Verification, judge_partition, verify
from ingest.ops.verify_report import PROBLEMS, Problem
from ingest.pipeline import Pipeline
from ingest.records import DEAD_LETTERS, ROWS, Coordinates
from ingest.testing.memory_table import MemoryCatalog

TP = TopicPartition("orders", 0)
#: the ledger's end: offsets 0..9 were read once
END = 10
#: offset 7 holds no record (a transaction marker), offset 3 is poison (a dead letter)
MARKER, POISON = 7, 3
KAFKA = [o for o in range(END) if o != MARKER]
GOOD = [o for o in KAFKA if o != POISON]
#: the good records of offsets 0..4, which the resets below read again
AGAIN = [0, 1, 2, 4]


@dataclass(frozen=True)
class Case:
    rows: list[int]
    dead: list[int]
    #: what verify must find: nothing (ok), or the offsets of each kind of problem
    found: dict[Problem, list[int]] = field(default_factory=dict)
    #: ranges a backward reset made the pipeline read again
    reread: list[tuple[int, int]] = field(default_factory=list)
    #: ranges a forward reset skipped
    excluded: list[tuple[int, int]] = field(default_factory=list)
    #: where the check starts (above 0: the history before it is expired)
    start: int = 0


WRONG = {
    "a row deleted": Case([o for o in GOOD if o != 5], [POISON], {"missing": [5]}),
    "a row past the ledger": Case([*GOOD, 12], [POISON], {"unexpected": [12]}),
    "a row where Kafka holds no record": Case([*GOOD, MARKER], [POISON], {"unexpected": [MARKER]}),
    "a row twice": Case([*GOOD, 4], [POISON], {"duplicated": [4]}),
    "a row three times where a reset read it twice": Case(
        [*GOOD, *AGAIN, 4], [POISON], {"duplicated": [4]}, reread=[(0, 5)]
    ),
    "a row once where a reset read it twice": Case(GOOD, [POISON], {"missing": AGAIN}, reread=[(0, 5)]),
    "a dead letter twice": Case(GOOD, [POISON, POISON], {"duplicated_dead_letters": [POISON]}),
    "a dead letter twice where a reset read it twice": Case(
        [*GOOD, *AGAIN], [POISON, POISON], {"duplicated_dead_letters": [POISON]}, reread=[(0, 5)]
    ),
    "a record both a row and a dead letter": Case([*GOOD, POISON], [POISON], {"in_both_tables": [POISON]}),
    "a good record also a dead letter": Case(GOOD, [POISON, 6], {"in_both_tables": [6]}),
    "a dead letter dropped": Case(GOOD, [], {"missing": [POISON]}),
    "a row in a range a forward reset skipped": Case(GOOD, [POISON], {"unexpected": [5]}, excluded=[(5, 6)]),
    "every kind at once": Case(
        [o for o in GOOD if o != 1] + [4, 12],
        [POISON, POISON, 6, 8],
        {
            "missing": [1],
            "duplicated": [4],
            "unexpected": [12],
            "duplicated_dead_letters": [POISON],
            "in_both_tables": [6, 8],
        },
    ),
}

RIGHT = {
    "each record once": Case(GOOD, [POISON]),
    "a row twice where a reset read it twice": Case([*GOOD, *AGAIN], [POISON], reread=[(0, 5)]),
    "a dead letter once and a row once where a reset read it twice (a fixed decoding)": Case(
        [*GOOD, *AGAIN, POISON], [POISON], reread=[(0, 5)]
    ),
    "a dead letter once where a reset read it twice": Case([*GOOD, *AGAIN], [POISON], reread=[(0, 5)]),
    "nothing where a forward reset skipped": Case([o for o in GOOD if o != 5], [POISON], excluded=[(5, 6)]),
    "a dead letter where a forward reset skipped (a fenced batch had it)": Case(GOOD, [POISON], excluded=[(3, 4)]),
    "a row once below an expired history": Case(GOOD, [POISON], start=2),
    "a dead letter past the ledger (its batch's rows are in, a crash came between)": Case(GOOD, [POISON, 11]),
}


def _judge(case: Case) -> dict[Problem, list[int]]:
    claims = Coverage(
        origin={TP: case.start},
        excluded=[(TP, lo, hi) for lo, hi in case.excluded],
        reread=[(TP, lo, hi) for lo, hi in case.reread],
        complete=case.start == 0,
    )
    top = claims.top(TP, END)
    kafka = pa.array([o for o in KAFKA if case.start <= o < top], pa.int64())
    rows, dead = pa.array(case.rows, pa.int64()), pa.array(case.dead, pa.int64())
    check = judge_partition((TP, case.start, top), END, kafka, rows, dead, claims)
    assert check.ok == (not check.found)
    assert check.as_dict()["ok"] == check.ok
    return check.found


@pytest.mark.parametrize("case", WRONG.values(), ids=WRONG.keys())
def test_verify_rejects_each_kind_of_wrong_table_naming_the_offsets(case: Case) -> None:
    assert _judge(case) == case.found


@pytest.mark.parametrize("case", RIGHT.values(), ids=RIGHT.keys())
def test_verify_accepts_what_the_ledger_history_accounts_for(case: Case) -> None:
    assert _judge(case) == {}


def test_every_kind_of_problem_is_tested_and_named_in_the_json() -> None:
    tested = {kind for case in WRONG.values() for kind in case.found}
    assert tested == set(PROBLEMS)
    check = judge_partition(
        (TP, 0, END), END, pa.array(KAFKA, pa.int64()), pa.array(GOOD), pa.array([POISON]), Coverage()
    )
    assert all(check.as_dict()[kind] == [] for kind in PROBLEMS)


# --- the whole verdict: the real verify over memory tables, corrupted by another writer ------------

CONFIG = parse(
    {
        "pipeline": "orders",
        "kafka": {"bootstrap.servers": "unused:9092"},
        "topics": [TP.topic],
        "catalog": {"name": "memory"},
        "table": "lake.orders",
        "schema": [{"name": "id", "type": "long"}],
    },
    "memory.yaml",
)


class Kafka:
    """What ``verify`` asks of Kafka: offsets ``0..END`` of one partition, :data:`MARKER` holding no record."""

    def describe(self) -> KafkaView:
        return KafkaView("cluster-A", {TP: Watermarks(0, END)})

    def read(self, spans: list[tuple[TopicPartition, int, int]]) -> Iterator[SimpleNamespace]:
        for tp, start, end in spans:
            offsets = [o for o in KAFKA if start <= o < end]
            n = len(offsets)
            yield SimpleNamespace(
                topic=pa.array([tp.topic] * n),
                partition=pa.array([tp.partition] * n, pa.int32()),
                offset=pa.array(offsets),
            )


def _coordinates(c: Coordinates, topic: str, offsets: list[int]) -> pa.Table:
    return pa.table(
        {
            c.topic: pa.array([topic] * len(offsets)),
            c.partition: pa.array([0] * len(offsets), pa.int32()),
            c.offset: pa.array(offsets, pa.int64()),
        }
    )


@dataclass
class Tables:
    rows: MemoryCatalog = field(default_factory=lambda: MemoryCatalog("lake.orders"))
    dead: MemoryCatalog = field(default_factory=lambda: MemoryCatalog("lake.orders_dead_letters"))

    def batch(self) -> None:
        """The pipeline's one batch: offsets 0..9, :data:`POISON` a dead letter."""
        rows, dead = self.rows.table(), self.dead.table()
        batch = plan_batch(None, Kafka().describe(), PlanPolicy("earliest", "fail", 100))
        files = rows.write(_coordinates(ROWS, TP.topic, GOOD))
        counts = BatchCounts(records=len(GOOD), dead_letters=1)
        dead_letters = DeadLetterSpool.of(_coordinates(DEAD_LETTERS, TP.topic, [POISON]))
        request = BatchCommit("orders", batch, batch.ledger(), files, dead_letters, counts, 3)
        assert commit_batch(rows, dead, request) is not None

    def add(self, catalog: MemoryCatalog, offsets: list[int], topic: str = TP.topic) -> int:
        """Another writer appends records at ``offsets``."""
        c = ROWS if catalog is self.rows else DEAD_LETTERS
        return catalog.append({}, [catalog.table().write(_coordinates(c, topic, offsets))[0]])  # type: ignore[list-item]

    def remove(self, catalog: MemoryCatalog, offset: int) -> int:
        """Another writer deletes the records at ``offset``."""
        c = ROWS if catalog is self.rows else DEAD_LETTERS
        return catalog.delete({}, lambda data: pc.equal(data[c.offset], offset))

    def verify(self) -> Verification:
        rows, dead = self.rows.table(), self.dead.table()
        return verify(Pipeline(CONFIG, Kafka(), rows, dead))  # type: ignore[arg-type]


#: another writer's change after the pipeline's last commit: what it does, what verify must find,
#: and what it must say the change did (to the rows or the dead letters: removed or added offsets)
CORRUPTIONS: dict[str, tuple[Callable[[Tables], int], dict[Problem, list[int]], tuple[str, list[int], list[int]]]] = {
    "a row deleted": (lambda t: t.remove(t.rows, 5), {"missing": [5]}, ("rows", [5], [])),
    "a row past the ledger": (lambda t: t.add(t.rows, [12]), {"unexpected": [12]}, ("rows", [], [12])),
    "a row twice": (lambda t: t.add(t.rows, [4]), {"duplicated": [4]}, ("rows", [], [4])),
    "a dead letter twice": (
        lambda t: t.add(t.dead, [POISON]),
        {"duplicated_dead_letters": [POISON]},
        ("dead letters", [], [POISON]),
    ),
    "a row also a dead letter": (lambda t: t.add(t.dead, [6]), {"in_both_tables": [6]}, ("dead letters", [], [6])),
    "a dead letter also a row": (
        lambda t: t.add(t.rows, [POISON]),
        {"in_both_tables": [POISON]},
        ("rows", [], [POISON]),
    ),
    "a dead letter dropped": (
        lambda t: t.remove(t.dead, POISON),
        {"missing": [POISON]},
        ("dead letters", [POISON], []),
    ),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_verify_judges_the_tables_at_their_heads_and_names_the_change_that_broke_them(
    corruption: tuple[Callable[[Tables], int], dict[Problem, list[int]], tuple[str, list[int], list[int]]],
) -> None:
    corrupt, found, (what, removed, added) = corruption
    tables = Tables()
    tables.batch()
    tables.add(tables.rows, [0, 1], topic="payments")  # another pipeline's rows before and after: not counted
    assert tables.verify().ok

    snapshot_id = corrupt(tables)
    tables.add(tables.rows, [2], topic="payments")

    verdict = tables.verify()
    (partition,) = verdict.partitions
    assert not verdict.ok and partition.found == found
    assert verdict.head_snapshot_id == tables.rows.head() != verdict.snapshot_id
    catalog = tables.rows if what == "rows" else tables.dead
    # (a file rewritten without the row is an overwrite, a file removed whole a delete, as Iceberg labels them)
    operation = next(s.operation for s in catalog.snapshots() if s.snapshot_id == snapshot_id)
    assert operation in (("delete", "overwrite") if removed else ("append",))
    assert [(c.what, c.snapshot_id, c.operation, list(c.removed), list(c.added)) for c in verdict.changes] == [
        (what, snapshot_id, operation, removed, added)
    ]
    assert verdict.as_dict()["partitions"][0][next(iter(found))] == next(iter(found.values()))
    assert verdict.as_dict()["changed_by_other_writers"][0]["snapshot_id"] == snapshot_id


def test_compaction_and_other_pipelines_after_the_last_commit_leave_the_verdict_alone() -> None:
    tables = Tables()
    tables.batch()
    tables.rows.append({MAINTENANCE_KEY: COMPACTION}, operation="replace")  # another engine's: the same rows
    tables.add(tables.rows, [0, 5, 12], topic="payments")
    tables.add(tables.dead, [POISON], topic="payments")
    tables.dead.append({MAINTENANCE_KEY: COMPACTION}, operation="replace")

    verdict = tables.verify()

    assert verdict.ok and verdict.changes == ()
    assert verdict.head_snapshot_id == tables.rows.head() != verdict.snapshot_id


def test_a_change_before_the_last_commit_is_found_and_not_blamed_on_a_later_writer() -> None:
    tables = Tables()
    tables.batch()
    tables.remove(tables.rows, 5)
    tables.rows.append(encode("orders", replace(find(tables), batch=2), BatchCounts()))  # the pipeline's next commit
    tables.add(tables.rows, [0], topic="payments")

    verdict = tables.verify()

    assert verdict.partitions[0].found == {"missing": [5]} and verdict.changes == ()


def find(tables: Tables) -> Ledger:
    found = observe(tables.rows.table(), CONFIG.pipeline)
    assert found is not None
    return found.ledger


def test_change_points_are_found_by_halving() -> None:
    states = [Counter({"a": 1})] * 40 + [Counter()] * 30 + [Counter({"b": 1})] * 30
    asked: list[int] = []

    def count(i: int) -> Counter[str]:
        asked.append(i)
        return states[i]

    found = change_points(count, len(states) - 1)

    assert [(i, dict(before), dict(after)) for i, before, after in found] == [(40, {"a": 1}, {}), (70, {}, {"b": 1})]
    assert len(asked) <= 2 + 2 * 7
    assert change_points(lambda i: states[0], 0) == []
