"""What the tables hold, record by record, against what a test produced.

Counts and coordinates cannot tell a wrong payload at the right offset (a value decoded into the
wrong row, a column shifted, a dead letter keeping another record's bytes): here every record a
test produced is looked up at its coordinates and compared by content. A good record must be one
row whose key and declared columns are what its JSON value says; a poison record one dead letter
with its own key, value and headers; and nothing else may be there, nor anything twice.

The tests' records are deterministic (``record()`` in tests/integration/conftest.py), and a
:class:`Log` gives each the offset Kafka gives it: offsets count up from 0 per partition in the
order a test produced them, as long as every record of the topic goes through the log.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingest.records import DEAD_LETTERS, ROWS

#: at most this many problems are spelt out in a failure (the counts of each kind always are)
SHOWN = 12


@dataclass(frozen=True)
class Sent:
    """One record a test produced, at the offset Kafka gave it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    #: a dead letter, not a row, is what the pipeline must make of it
    dead: bool

    @property
    def at(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)


@dataclass
class Log:
    """The records produced to a test's topics, with their offsets."""

    sent: list[Sent] = field(default_factory=list)
    _next: Counter[tuple[str, int]] = field(default_factory=Counter)

    def add(
        self,
        topic: str,
        records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes]] | None]],
        dead: Sequence[bool],
    ) -> None:
        """``records`` (partition, key, value, headers) produced to ``topic`` in this order; ``dead[i]``:
        record ``i`` is poison."""
        for (partition, key, value, headers), poison in zip(records, dead, strict=True):
            offset = self._next[(topic, partition)]
            self._next[(topic, partition)] += 1
            self.sent.append(Sent(topic, partition, offset, key, value, tuple(headers or ()), poison))


def _typed(value: Any, kind: pa.DataType) -> Any:
    """A JSON field's value as the table's column of type ``kind`` holds it."""
    if value is None:
        return None
    if pa.types.is_decimal(kind):
        return Decimal(str(value))
    if pa.types.is_timestamp(kind):
        return datetime.fromisoformat(value)
    return value


def _declared(table: pa.Table) -> list[pa.Field]:
    """The columns decoded from the records' values (the pipeline's own columns start with ``_``)."""
    return [f for f in table.schema if not f.name.startswith("_")]


def _report(what: str, problems: list[str]) -> str:
    kinds = Counter(problem.split(":", 1)[0] for problem in problems)
    counted = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return f"the {what} are not what was produced ({counted}):\n  {shown}{more}"


def _index(table: pa.Table, names: Sequence[str]) -> dict[tuple[str, int, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    topic, partition, offset = names
    for row in table.to_pylist():
        found[(row[topic], row[partition], row[offset])].append(row)
    return found


def _compare(
    expected: dict[tuple[str, int, int], dict[str, Any]],
    found: dict[tuple[str, int, int], list[dict[str, Any]]],
) -> list[str]:
    problems = []
    for at, want in sorted(expected.items()):
        held = found.get(at, [])
        if not held:
            problems.append(f"missing: {at}")
            continue
        if len(held) > 1:
            problems.append(f"stored {len(held)} times: {at}")
        for row in held:
            wrong = {name: (row.get(name), value) for name, value in want.items() if row.get(name) != value}
            if wrong:
                said = ", ".join(f"{name} is {got!r}, produced {value!r}" for name, (got, value) in wrong.items())
                problems.append(f"wrong content: {at}: {said}")
    problems += [f"unexpected: {at} ({len(rows)}x)" for at, rows in sorted(found.items()) if at not in expected]
    return problems


def row_problems(rows: pa.Table, sent: Iterable[Sent]) -> list[str]:
    """How the rows table ``rows`` (all its columns) differs from the good records of ``sent``."""
    declared = _declared(rows)
    expected = {}
    for record in sent:
        if record.dead:
            continue
        body = json.loads(record.value or b"null")
        want = {f.name: _typed(body.get(f.name), f.type) for f in declared}
        expected[record.at] = {ROWS.key: record.key, **want}
    return _compare(expected, _index(rows, (ROWS.topic, ROWS.partition, ROWS.offset)))


def dead_letter_problems(dead: pa.Table, sent: Iterable[Sent]) -> list[str]:
    """How the dead-letter table ``dead`` differs from the poison records of ``sent``."""
    expected = {
        record.at: {
            DEAD_LETTERS.key: record.key,
            "value": record.value,
            "headers": [{"key": k, "value": v} for k, v in record.headers] or None,
        }
        for record in sent
        if record.dead
    }
    found = _index(dead, (DEAD_LETTERS.topic, DEAD_LETTERS.partition, DEAD_LETTERS.offset))
    for held in found.values():
        for letter in held:
            letter["headers"] = letter["headers"] or None  # no headers: stored as null or as []
    return _compare(expected, found)


def assert_holds(rows: pa.Table | None, dead: pa.Table | None, sent: Iterable[Sent]) -> None:
    """The rows table ``rows`` and the dead-letter table ``dead`` hold exactly what ``sent`` makes of
    them (either None: not looked at)."""
    records = list(sent)
    if rows is not None:
        problems = row_problems(rows, records)
        assert not problems, _report("rows", problems)
    if dead is not None:
        problems = dead_letter_problems(dead, records)
        assert not problems, _report("dead letters", problems)
