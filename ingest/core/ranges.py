"""Offset ranges: a batch's ``[start, end)`` per partition, cut into tasks and shares, and the
check that what several readers read covers a batch exactly once. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ingest.core.ledger import TopicPartition

#: offsets ``[start, end)`` of one partition
Range = tuple[TopicPartition, int, int]


@dataclass(frozen=True)
class TaskRange:
    """One Spark task's share of a batch: offsets ``[start, end)`` of one partition."""

    index: int
    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def _divide(tp: TopicPartition, start: int, end: int, parts: int) -> list[Range]:
    """``[start, end)`` as ``parts`` contiguous pieces of near-equal size (the last takes the rest)."""
    pieces, remaining = [], end - start
    for part in range(parts):
        size = remaining // (parts - part)
        pieces.append((tp, start, start + size))
        start, remaining = start + size, remaining - size
    return pieces


def split_ranges(
    ranges: Sequence[Range],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[TaskRange]:
    """Planned ranges as tasks that together cover every range exactly, each piece non-empty.

    First no task gets more than ``max_records_per_partition`` offsets; then, if that leaves fewer
    than ``min_partitions`` tasks, each piece is split again in proportion to its size (Spark's
    Kafka source does the same with ``minPartitions``, rounding halves up).
    """
    pieces = [
        piece
        for tp, start, end in ranges
        if end > start
        for piece in _divide(tp, start, end, math.ceil((end - start) / (max_records_per_partition or end - start)))
    ]
    if min_partitions is not None and len(pieces) < min_partitions:
        total = sum(end - start for _, start, end in pieces)
        pieces = [
            smaller
            for tp, start, end in pieces
            for smaller in _divide(
                tp, start, end, min(end - start, max(1, math.floor((end - start) / total * min_partitions + 0.5)))
            )
        ]
    return [TaskRange(i, tp, start, end) for i, (tp, start, end) in enumerate(pieces)]


def share(ranges: Sequence[Range], parts: int) -> list[list[Range]]:
    """The ranges as at most ``parts`` groups of near-equal offset counts (one per worker).

    The ranges are laid end to end and cut into equal stretches, so a group holds whole ranges and
    at most two partial ones, and every offset of every range is in exactly one group. Empty
    ranges are left out; groups are never empty.
    """
    nonempty = [(tp, start, end) for tp, start, end in ranges if end > start]
    total = sum(end - start for _, start, end in nonempty)
    parts = max(1, min(parts, total))
    groups: list[list[Range]] = []
    pending = list(reversed(nonempty))
    left = total
    for part in range(parts):
        want = left // (parts - part)
        left -= want
        group: list[Range] = []
        while want > 0:
            tp, start, end = pending.pop()
            take = min(want, end - start)
            group.append((tp, start, start + take))
            if start + take < end:
                pending.append((tp, start + take, end))
            want -= take
        groups.append(group)
    return [g for g in groups if g]


def coverage_problem(expected: Sequence[Range], read: Sequence[Range]) -> str | None:
    """What is wrong with ``read`` as a tiling of ``expected`` (None: every offset once)."""
    pieces: dict[TopicPartition, list[tuple[int, int]]] = {}
    for tp, start, end in read:
        pieces.setdefault(tp, []).append((start, end))
    wanted = {tp: (start, end) for tp, start, end in expected if end > start}
    for tp in pieces.keys() - wanted.keys():
        return f"read {tp}, which the batch does not cover"
    for tp, (start, end) in wanted.items():
        cursor = start
        for low, high in sorted(pieces.get(tp, [])):
            if low != cursor:
                how = "missed" if low > cursor else "read twice"
                return f"{how} offsets of {tp} from {min(low, cursor)} (covering {start}..{end})"
            cursor = high
        if cursor != end:
            return f"covered {tp} up to {cursor}, not {end}"
    return None
