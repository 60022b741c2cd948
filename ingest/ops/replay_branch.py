"""A replay's dead-letter branch: forked from the dead-letter table's main (which gets the
pipeline's floor first), rewound to what the replayed-from snapshot's line had read; and the
idempotent commits the replay makes on either table (see :mod:`ingest.ops.replay`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ingest.assembly import Opened
from ingest.committer import observe
from ingest.core.ledger import BatchCounts, Found, Ledger, rewind_of
from ingest.core.ledger_codec import encode, find_ledger, register
from ingest.dead_letters import rewind, settle
from ingest.errors import CommitConflict, CommitGaveUp, CommitUnknown
from ingest.iceberg.table import MAIN, IcebergTable
from ingest.intents import Append, MoveRef

log = logging.getLogger(__name__)


def branch_dead_letters(pipeline: Opened, branch: str, start: Found) -> None:
    """The dead-letter table's branch for a replay: at its main head, with this pipeline's dead
    letters past what S's line had read removed (the replay stores them again, as its decoding says).
    Idempotent: every copy of the replay does it before its first batch (:func:`dead_letters_ready`)."""
    dead = pipeline.dead
    dead.refresh()
    if dead.branch_head(branch) is None:
        _floor_on_main(pipeline)
        fork = dead.branch_head(MAIN)
        assert fork is not None  # (main holds the floor)
        settled(lambda: dead.commit(MoveRef(branch, fork, expected=None)), dead)
    # S's own batch put its dead letters on main before anything was committed on top of it (and
    # main's head settled above): the branch holds them, and its ledger says so
    sync = start.ledger.sync
    to, gaps = rewind_of(start.ledger)
    rewind(
        dead.on_branch(branch),
        pipeline.config.pipeline,
        pipeline.config.topics_in(start.ledger.topics),
        to,
        f"{branch}-start-{_fork(dead, branch)}",
        pipeline.config.commit.max_attempts,
        also=[sync.sync_id] if sync is not None and sync.files is not None else [],
        gaps=gaps,
    )


def dead_letters_ready(pipeline: Opened, branch: str, target: int, start: Found | None = None) -> None:
    """Before a replay's batches run on rows branch ``branch`` (forked at ``target``), made after
    the rows branch: main's head owes the dead-letter table nothing, and while the rows branch has
    no batch yet, the dead-letter branch of the same name exists and is rewound.

    An earlier replay from the same snapshot may have been published just before the rows branch
    was made (its publish removed the earlier rows branch, so this one could be made): its step,
    done here first, makes the earlier dead-letter branch main and removes it. Adopting that branch
    would put this replay's dead letters on the dead-letter table's main, or publish them with the
    earlier replay's. A rows branch with batches of its own and no dead-letter branch was begun by
    an older version: its dead letters stay on main (:meth:`ingest.pipeline.Pipeline.on_branch`)."""
    rows, name = pipeline.rows, pipeline.config.pipeline
    head = observe(rows, name)
    settle(pipeline.dead, rows, pipeline.config, head.ledger if head else None, attempts(pipeline))
    if rows.branch_head(branch) != target:
        return
    start = start or find_ledger(name, rows.ancestry(target))
    if start is not None:  # (the branch holds its fork: expiry keeps it)
        branch_dead_letters(pipeline, branch, start)


def _fork(dead: IcebergTable, branch: str) -> int | None:
    """The snapshot of the dead-letter table's main that ``branch`` forked at: it names the replay's
    steps on that table, which a later replay from the same snapshot must not find done already
    (main remembers the steps of the branches it took)."""
    on_main = {snap.snapshot_id for snap in dead.ancestry(dead.branch_head(MAIN))}
    return next(
        (snap.snapshot_id for snap in dead.ancestry(dead.branch_head(branch)) if snap.snapshot_id in on_main), None
    )


def _floor_on_main(pipeline: Opened) -> None:
    """Give the dead-letter table's main a ledger of the pipeline (an empty floor) where it has none:
    none of the pipeline's dead letters are there yet. A ledger on the replay's branch registers the
    pipeline on the whole table (table properties are not per branch), and a run would then take
    a main without one for a table that lost its ledger (:class:`LedgerLost`)."""
    dead, name = pipeline.dead, pipeline.config.pipeline
    empty = encode(name, Ledger(batch=0, offsets={}), BatchCounts())
    for _ in range(attempts(pipeline)):
        if observe(dead, name) is not None:  # (fails closed where the table lost it)
            return
        settled(lambda: dead.commit(Append([], empty, register(dead.head().properties, name))), dead)
    if observe(dead, name) is None:
        raise CommitGaveUp(
            f"the replay's first commit to {dead.identifier} did not settle after {attempts(pipeline)} attempts "
            "(other writers kept committing). Nothing of the replay was committed; run it again."
        )


def settled(commit: Callable[[], object], table: IcebergTable) -> None:
    """Run one idempotent ref or snapshot commit; a conflict means a concurrent copy did it."""
    try:
        commit()
    except (CommitConflict, CommitUnknown) as error:
        log.info("%s: %s; observing again", table.identifier, error)
        table.refresh()


def attempts(pipeline: Opened) -> int:
    return pipeline.config.commit.max_attempts
