"""Which other writers' snapshots changed the offsets ``ingest verify`` found wrong.

``verify`` judges each table at its head, what readers see. Every snapshot on the branch after the
pipeline's last commit to a table (the newest carrying its ledger) is another writer's: another
pipeline, a compaction, a delete or a fix by another tool. Where offsets are wrong, the snapshots
among those that changed how many times they are stored are named, with the offsets each removed
or added: verify reads only their coordinates, and only of the offsets found wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import pyarrow as pa

from ingest.core.ledger import SnapshotView, TopicPartition
from ingest.core.ledger_codec import offsets_key
from ingest.records import DEAD_LETTERS, Coordinates

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Change:
    """Another writer's snapshot that changed how many times offsets of one partition are stored."""

    table: str
    what: Literal["rows", "dead letters"]
    snapshot_id: int
    #: Iceberg's snapshot operation: append, overwrite, replace or delete
    operation: str | None
    topic: str
    partition: int
    #: offsets of which the snapshot removed a copy
    removed: tuple[int, ...]
    #: offsets of which the snapshot added a copy
    added: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "what": self.what,
            "snapshot_id": self.snapshot_id,
            "operation": self.operation,
            "topic": self.topic,
            "partition": self.partition,
            "removed": list(self.removed),
            "added": list(self.added),
        }


class Scanned(Protocol):
    """What blame reads of a table: its snapshots, and coordinates at one of them."""

    @property
    def identifier(self) -> str: ...

    def ancestry(self, start: int | None = None) -> Iterator[SnapshotView]: ...

    def coordinates_in(
        self, columns: Coordinates, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]], snapshot_id: int
    ) -> pa.Table: ...


def change_points(count: Callable[[int], Counter[K]], last: int) -> list[tuple[int, Counter[K], Counter[K]]]:
    """The states ``i`` in ``1..last`` whose ``count(i)`` differs from ``count(i - 1)``, each with
    both counts, oldest first; found by halving, so asking ``count`` about ``2 + k·log2(last)``
    states for ``k`` changes. A stretch whose two ends count the same is taken as unchanged:
    whatever changed inside it changed back."""
    found: list[tuple[int, Counter[K], Counter[K]]] = []

    def between(lo: int, hi: int, before: Counter[K], after: Counter[K]) -> None:
        if before == after:
            return
        if hi == lo + 1:
            found.append((hi, before, after))
            return
        middle = (lo + hi) // 2
        at = count(middle)
        between(lo, middle, before, at)
        between(middle, hi, at, after)

    if last > 0:
        between(0, last, count(0), count(last))
    return found


def blame(
    table: Scanned,
    pipeline: str,
    columns: Coordinates,
    suspects: Mapping[TopicPartition, Sequence[int]],
    head: int | None,
) -> list[Change]:
    """The snapshots of other writers after ``pipeline``'s last commit to ``table`` (up to
    ``head``) that changed how many times the ``suspects`` offsets are stored, oldest first. With
    no commit of the pipeline's on the branch (or its history expired), from the oldest snapshot
    left."""
    if head is None or not any(suspects.values()):
        return []
    chain: list[SnapshotView] = []
    for snap in table.ancestry(head):
        chain.append(snap)
        if offsets_key(pipeline) in snap.summary:
            break
    chain.reverse()  # the pipeline's last commit (or the oldest snapshot left) first
    spans = {tp: [(o, o + 1) for o in sorted(set(offsets))] for tp, offsets in suspects.items() if offsets}
    counted: dict[int, Counter[tuple[TopicPartition, int]]] = {}

    def count(i: int) -> Counter[tuple[TopicPartition, int]]:
        if i not in counted:
            data = table.coordinates_in(columns, spans, chain[i].snapshot_id)
            topic, partition, offset = (data[c].to_pylist() for c in (columns.topic, columns.partition, columns.offset))
            counted[i] = Counter((TopicPartition(t, p), o) for t, p, o in zip(topic, partition, offset, strict=True))
        return counted[i]

    what: Literal["rows", "dead letters"] = "dead letters" if columns == DEAD_LETTERS else "rows"
    changes = []
    for i, before, after in change_points(count, len(chain) - 1):
        snap = chain[i]
        for tp in sorted({tp for tp, _ in before.keys() | after.keys()}):
            offsets = {o for t, o in before.keys() | after.keys() if t == tp}
            removed = tuple(sorted(o for o in offsets if before[(tp, o)] > after[(tp, o)]))
            added = tuple(sorted(o for o in offsets if after[(tp, o)] > before[(tp, o)]))
            if removed or added:
                where = (snap.snapshot_id, snap.operation, tp.topic, tp.partition)
                changes.append(Change(table.identifier, what, *where, removed, added))
    return changes
