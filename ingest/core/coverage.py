"""What a pipeline's ledger history claims about each offset: where reading began, the ranges it
skipped on purpose and the ranges it read again on purpose. Pure: ``ingest verify`` sets the tables'
contents against it (:mod:`ingest.ops.verify`).

Ranges are half-open ``[start, end)``; an offset here is a Kafka offset (not "next to read") unless
a name says ``end``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ingest.core.ledger import RESET_MEMORY, SnapshotView, TopicPartition
from ingest.core.ledger_codec import decode, read_extra
from ingest.core.ranges import Range


@dataclass
class Coverage:
    """What the ledger history claims: where it starts, what it skipped, what it re-read on purpose."""

    origin: dict[TopicPartition, int] = field(default_factory=dict)
    #: ranges deliberately not ingested: lost to retention (``skip``) or skipped by a forward reset
    excluded: list[Range] = field(default_factory=list)
    #: ranges a backward reset made the pipeline ingest once more
    reread: list[Range] = field(default_factory=list)
    #: whether ``origin`` is where each partition began (the newest ledger carries it, or the
    #: history reaches back to the first ledger): then every offset read is accounted for
    complete: bool = False

    def top(self, tp: TopicPartition, end: int) -> int:
        """The highest offset (exclusive) of ``tp`` the rows may hold: the ledger's ``end``, or
        above it, where a backward reset moved it from."""
        return max([end, *(hi for t, _, hi in self.reread if t == tp)])

    def lowest(self, tp: TopicPartition, end: int) -> int:
        """The lowest offset of ``tp`` whose reads the history accounts for: where the partition
        began, or below, where a backward reset moved it (``end`` if it has no record of the
        partition). With the history's start expired, the oldest ledger's start."""
        if not self.complete:
            return self.origin.get(tp, end)
        return min([self.origin.get(tp, end), *(lo for t, lo, _ in self.reread if t == tp)])


def coverage(name: str, ancestry: Iterable[SnapshotView]) -> Coverage:
    """What the ledger history of pipeline ``name`` on a branch (``ancestry``, newest first) claims."""
    ledgers = [(snap, ledger) for snap in ancestry if (ledger := decode(name, snap.summary)) is not None]
    result = Coverage()
    # the newest ledger remembers the recent resets' moves, also once their snapshots are expired
    remembered = ledgers[0][1].resets if ledgers else ()
    for reset in remembered:
        for tp, was, moved_to in reset.moves:
            _claim(result, tp, was, moved_to)
    # where each partition began: the newest ledger carries it (unless its history began before
    # origins were kept, or it forgot resets), else the start of the oldest ledger that has it
    # (after a backward reset below it, later ledgers start lower: those reads are the reset's,
    # counted as such). Once the first ledgers are expired, the lowest start there is (reads
    # below it are not checked)
    newest = ledgers[0][1] if ledgers else None
    if newest is not None and newest.origin and len(newest.resets) < RESET_MEMORY:
        result.complete = True
        result.origin = dict(newest.origin)
    else:
        result.complete = bool(ledgers) and ledgers[-1][1].batch == 1
        for _, ledger in reversed(ledgers):
            for tp, start in ledger.start_offsets.items():
                if result.complete:
                    result.origin.setdefault(tp, start)
                else:
                    result.origin[tp] = min(result.origin.get(tp, start), start)
    for i, (snap, ledger) in enumerate(ledgers):
        result.excluded.extend((r.tp, r.start, r.end) for r in ledger.lost)
        reset_id = read_extra(name, snap.summary, "reset-id")
        if reset_id is None or read_extra(name, snap.summary, "restamped-by") or i + 1 == len(ledgers):
            continue
        if any(r.reset_id == reset_id for r in remembered):
            continue
        before = ledgers[i + 1][1].offsets
        for tp, moved_to in ledger.offsets.items():
            _claim(result, tp, before.get(tp, moved_to), moved_to)
    return result


def _claim(result: Coverage, tp: TopicPartition, was: int, moved_to: int) -> None:
    if was > moved_to:
        result.reread.append((tp, moved_to, was))
    elif was < moved_to:
        result.excluded.append((tp, was, moved_to))
