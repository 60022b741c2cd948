"""Moving a branch's work onto main without dropping what main gained meanwhile.

Used by ``ingest replay --publish`` for the rows table and for its dead-letter table alike. What
main holds since the branch forked (its snapshots back to the first one on the branch's line) is
sorted into three kinds:

- this pipeline's own commits (they carry its ledger): the branch redid them, they are dropped;
- compactions by ``ingest maintain``: they only rewrote rows that the branch holds or that are
  re-applied below, from files main's history still references (expiry keeps main's line back to
  the fork while the branch exists), so they are dropped too;
- appends by other writers (another pipeline on the same table, an insert by another tool): their
  data files and their ``ingest.*`` summary keys (another pipeline's ledger) are re-applied onto the
  branch, oldest first, each marked ``ingest.reapplied-from`` so a second attempt skips them;
- anything else (a delete, an overwrite by another tool) cannot be carried over: the publish is
  refused, naming those snapshots, before anything changes.
"""

from __future__ import annotations

import logging

from ingest.core.expiry import MAIN
from ingest.core.ledger import BatchCounts, SnapshotView
from ingest.core.ledger_codec import (
    COMPACTION,
    MAINTENANCE_KEY,
    REAPPLIED_FROM_KEY,
    encode,
    find_ledger,
    ours,
    registered_pipelines,
)
from ingest.errors import CommitConflict, CommitUnknown, PublishRefused
from ingest.intents import Reapply, RemoveRef
from ingest.ports import LedgerTable

log = logging.getLogger(__name__)


def _since(table: LedgerTable, head: int | None, stop: set[int]) -> list[SnapshotView]:
    """Snapshots from ``head`` back to (not including) the first one in ``stop``, newest first.

    Raises :class:`PublishRefused` if the chain breaks first (expired parents): what main gained
    cannot be told apart from what the branch redid then."""
    found: list[SnapshotView] = []
    for snap in table.ancestry(head):
        if snap.snapshot_id in stop:
            return found
        found.append(snap)
    if head is None:
        return found
    raise PublishRefused(
        f"main's history in {table.identifier} no longer reaches the branch being published (snapshots were "
        "expired), so what main gained since cannot be told apart from what the branch redid. Nothing was changed."
    )


def _gained(table: LedgerTable, pipeline: str, branch: str) -> list[SnapshotView]:
    """Every other writer's commit on main since ``branch`` forked (compactions aside), oldest last."""
    on_branch = {snap.snapshot_id for snap in table.ancestry(table.branch_head(branch))}
    return [
        snap
        for snap in _since(table, table.branch_head(MAIN), on_branch)
        if snap.summary.get(MAINTENANCE_KEY) != COMPACTION and find_ledger(pipeline, [snap]) is None
    ]


def uncarryable(table: LedgerTable, pipeline: str, branch: str) -> str | None:
    """The commits on main since ``branch`` forked that cannot be carried over onto it (a delete,
    an overwrite, another pipeline's rollback of its dead letters), listed; None if there are none."""
    blocking = [snap for snap in _gained(table, pipeline, branch) if snap.operation != "append"]
    return ", ".join(f"{snap.snapshot_id} ({snap.operation})" for snap in blocking) or None


def carryable(table: LedgerTable, pipeline: str, branch: str) -> list[SnapshotView]:
    """Every other writer's append on main since ``branch`` forked, oldest last; raises
    :class:`PublishRefused` if main holds anything else the branch did not redo
    (:func:`uncarryable`). Changes nothing: a publish asks this of the dead-letter table before it
    moves the rows table's main."""
    listed = uncarryable(table, pipeline, branch)
    if listed is not None:
        raise PublishRefused(
            f"publish of {branch} on {table.identifier} refused: main has commits since the branch forked that "
            f"cannot be carried over onto it: {listed}. Nothing was changed and the branch is kept. Re-apply those "
            "changes to the branch yourself and publish again, or roll main back instead (--rollback)."
        )
    return _gained(table, pipeline, branch)


def carry_over(table: LedgerTable, pipeline: str, branch: str) -> int:
    """Re-apply onto ``branch`` every other writer's append on main since the branch forked;
    returns how many were applied now. Raises :class:`PublishRefused` (changing nothing) if main
    holds anything else the branch did not redo. Each re-applied commit requires the branch head."""
    gained = carryable(table, pipeline, branch)
    reapplied = {
        snap.summary[REAPPLIED_FROM_KEY]
        for snap in table.ancestry(table.branch_head(branch))
        if REAPPLIED_FROM_KEY in snap.summary
    }
    target = table.on_branch(branch)
    count = 0
    for snap in reversed(gained):  # oldest first, so each pipeline's newest ledger ends on top
        if str(snap.snapshot_id) in reapplied:
            continue
        summary = ours(snap.summary)
        summary[REAPPLIED_FROM_KEY] = str(snap.snapshot_id)
        target.commit(Reapply(snap.snapshot_id, summary))
        count += 1
    table.refresh()
    return count


def main_ledgers(table: LedgerTable, pipeline: str, branch: str) -> dict[str, str]:
    """The summary keys that re-stamp, on the branch a publish makes main, the ledger main holds for
    every other pipeline registered on ``table`` where the branch's line lacks it: a compaction may
    be the only snapshot left that carries it (expiry removed the pipeline's own, and the branch
    forked where its parents were gone), and compactions are not carried over. Call it after
    :func:`carry_over`: the branch then holds every other pipeline's rows that main holds."""
    keys: dict[str, str] = {}
    main_line, branch_line = table.ancestry(table.branch_head(MAIN)), table.ancestry(table.branch_head(branch))
    main_snaps, branch_snaps = list(main_line), list(branch_line)
    for other in registered_pipelines(table.head().properties):
        if other == pipeline:
            continue
        on_main, on_branch = find_ledger(other, main_snaps), find_ledger(other, branch_snaps)
        if on_main is not None and (on_branch is None or on_branch.ledger != on_main.ledger):
            keys |= encode(other, on_main.ledger, BatchCounts(), extra={"restamped-by": "publish"})
    return keys


def remove_branch(table: LedgerTable, branch: str) -> None:
    """Drop a published branch (main now holds all of it), requiring it to be where it was seen.
    A failure is only logged: the branch is left behind, and expiry keeps it."""
    head = table.branch_head(branch)
    if head is None:
        return
    try:
        table.commit(RemoveRef(branch, expected=head))
    except (CommitConflict, CommitUnknown) as error:
        log.warning("branch %s of %s was not removed (%s); remove it when convenient", branch, table.identifier, error)
