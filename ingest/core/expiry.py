"""Which snapshots expiry may remove without losing a ledger, a ref, or a replay's fork.

Pure: the adapter passes the refs, a way to walk a snapshot's ancestry (parent links, ending where
the chain ends or breaks), and every snapshot; it commits the result requiring every ref to be
unchanged (see :class:`ingest.intents.Expire`), so a plan made on stale metadata never lands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ingest.core.ledger import SnapshotView
from ingest.core.ledger_codec import find_ledger

MAIN = "main"


@dataclass(frozen=True)
class Ref:
    """A branch or tag."""

    name: str
    snapshot_id: int
    is_branch: bool


Ancestry = Callable[[int], Iterable[SnapshotView]]


def protected(refs: Sequence[Ref], ancestry: Ancestry, pipelines: Sequence[str]) -> set[int]:
    """Snapshots expiry must keep:

    - every branch's and tag's snapshot;
    - on each branch, the path from its head to each of ``pipelines``' newest ledger (the whole
      branch while a pipeline's ledger is not found on it): the ledger lookup walks parent links;
    - for each branch other than main (a replay's), its line down to where it forked from main,
      and main's line from its head down to that fork: publishing compares the two.
    """
    heads = {ref.name: ref.snapshot_id for ref in refs if ref.is_branch}
    main_line = [snap.snapshot_id for snap in ancestry(heads[MAIN])] if MAIN in heads else []
    keep: set[int] = set()
    for ref in refs:
        keep.add(ref.snapshot_id)
        if not ref.is_branch:
            continue
        pending = set(pipelines)
        forked = ref.name == MAIN
        for snap in ancestry(ref.snapshot_id):
            if not pending and forked:
                break
            keep.add(snap.snapshot_id)
            pending -= {name for name in pending if find_ledger(name, [snap]) is not None}
            if not forked and snap.snapshot_id in main_line:
                forked = True
                keep.update(main_line[: main_line.index(snap.snapshot_id)])
    return keep


def doomed(snapshots: Sequence[SnapshotView], keep: set[int], keep_last: int, cutoff_ms: int) -> list[int]:
    """Snapshots older than ``cutoff_ms``, not among the newest ``keep_last`` and not in ``keep``."""
    ordered = sorted(snapshots, key=lambda s: s.timestamp_ms)
    kept = keep | {s.snapshot_id for s in ordered[len(ordered) - keep_last :]}
    return [s.snapshot_id for s in ordered if s.timestamp_ms < cutoff_ms and s.snapshot_id not in kept]
