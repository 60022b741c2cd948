"""What ``ingest verify`` reports of one partition: the offsets of each kind of problem found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.ledger import TopicPartition

#: how many offsets of each kind a verification report lists per partition
SAMPLE = 20


#: what verify can find wrong with an offset, as ``--json`` names it: no row or dead letter where the
#: ledger read the record; more rows than reads; a row where no read put one; a dead letter more
#: than once; a record both a row and a dead letter although the ledger read it once
Problem = Literal["missing", "duplicated", "unexpected", "duplicated_dead_letters", "in_both_tables"]
PROBLEMS: tuple[Problem, ...] = get_args(Problem)


@dataclass
class PartitionCheck:
    tp: TopicPartition
    start: int
    end: int
    #: the end of the offsets checked: ``end``, or above it, where a backward reset moved the ledger from
    top: int | None = None
    in_kafka: int = 0
    rows: int = 0
    dead_letters: int = 0
    #: the offsets of each problem found (a sample of at most :data:`SAMPLE`)
    found: dict[Problem, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.found.values())

    def problems(self) -> list[tuple[Problem, list[int]]]:
        """Each kind of problem with the offsets found (a sample of at most :data:`SAMPLE`)."""
        return [(kind, self.found.get(kind, [])) for kind in PROBLEMS]

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "start": self.start,
            "end": self.end,
            "checked_to": self.top if self.top is not None else self.end,
            "in_kafka": self.in_kafka,
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            **dict(self.problems()),
            "ok": self.ok,
        }


def offsets_by_partition(table: pa.Table, topic: str, partition: str, offset: str) -> dict[TopicPartition, pa.Array]:
    """The offsets of ``table`` (columns ``topic``, ``partition``, ``offset``) by partition."""
    result: dict[TopicPartition, pa.Array] = {}
    if table.num_rows == 0:
        return result
    keys = table.group_by([topic, partition]).aggregate([]).to_pylist()
    for key in keys:
        mask = pc.and_(pc.equal(table[topic], key[topic]), pc.equal(table[partition], key[partition]))
        result[TopicPartition(key[topic], key[partition])] = table.filter(mask)[offset].combine_chunks()
    return result


def sample(array: pa.Array) -> list[int]:
    """The first :data:`SAMPLE` of ``array``'s offsets, in order."""
    return sorted(array.to_pylist())[:SAMPLE]
