"""``ingest verify``'s judgement of one partition (:func:`ingest.ops.report._check`): every kind of
wrong table it must reject, each naming its offsets, and the right tables it must accept."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from ingest.core.ledger import TopicPartition
from ingest.ops.report import PROBLEMS, Coverage, Problem, _check

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
    check = _check((TP, case.start, top), END, kafka, rows, dead, claims)
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
    check = _check((TP, 0, END), END, pa.array(KAFKA, pa.int64()), pa.array(GOOD), pa.array([POISON]), Coverage())
    assert all(check.as_dict()[kind] == [] for kind in PROBLEMS)
