"""``ingest replay``: re-ingest everything after snapshot S from Kafka, with no duplicates or gaps.

Default (non-destructive): a branch ``replay-<S>`` is created at S and batches are committed to it
until caught up; the report compares it with main, and the branch stays for audit (expiry keeps
every branch). ``publish`` then moves main to the branch head without dropping anything main
gained since S that the replay did not redo:

- this pipeline's own snapshots on main since S are what the replay redid, and compactions by
  ``ingest maintain`` only rewrote rows that the branch holds or gets re-applied (expiry keeps
  main's history back to S while the branch exists, so the files they rewrote are still there);
- appends by other writers (another pipeline on the same table, an insert by another tool) are
  re-applied onto the branch, oldest first, with their data files and their ledger keys, marked
  ``ingest.reapplied-from``;
- anything else (a delete, an overwrite, a compaction) cannot be carried over: publish refuses,
  naming those snapshots, and changes nothing (:class:`PublishRefused`);

then main is fast-forwarded to the branch head with a compare-and-swap on main's head (a batch
that lands meanwhile makes it catch up and try again), and the branch is removed.

``rollback`` instead points main back at S (compare-and-swap on main's head), and the normal runs
continue from S's ledger; it refuses if another pipeline registered on the table has no ledger in
S's ancestry (it would lose it). Before anything changes, the replay checks that Kafka still holds
every record after S's ledger and fails naming the missing ranges if not.

The dead-letter table follows (:mod:`ingest.dead_letters`): a replay's dead letters go to its
branch of the same name, rewound at its start to what S's line had read (to S's ledger, or above
it after a backward reset, less what a forward reset skipped: :func:`ingest.core.ledger.rewind_of`),
and publish makes it main; a rollback removes the others. Re-read ranges so add none twice.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace

from ingest import failpoints
from ingest.assembly import Opened
from ingest.carry_over import carry_over, carryable, main_ledgers, remove_branch
from ingest.committer import observe
from ingest.core.ledger import BatchCounts, DeadLetterSync, Found, rewind_of
from ingest.core.ledger_codec import encode, find_ledger, read_extra, registered_pipelines
from ingest.dead_letters import marker, settle
from ingest.errors import (
    CommitConflict,
    CommitUnknown,
    ConfigError,
    MainMoved,
    PublishRefused,
    ReplayImpossible,
    RollbackRefused,
)
from ingest.iceberg.reading import snapshot_as_of
from ingest.iceberg.table import MAIN, IcebergTable
from ingest.intents import Append, MoveRef, RemoveRef
from ingest.ops.replay_branch import attempts, dead_letters_ready, settled
from ingest.ops.replay_result import Discarded, ReplayResult, compare
from ingest.retry import Again, with_retries
from ingest.runner import Run

log = logging.getLogger(__name__)
PUBLISH_ATTEMPTS = 5


def resolve_snapshot(table: IcebergTable, snapshot_id: int | None, as_of_ms: int | None) -> int:
    if snapshot_id is None:
        assert as_of_ms is not None
        found = snapshot_as_of(table, as_of_ms)
        if found is None:
            raise ConfigError(f"--as-of: main has no snapshot at or before {as_of_ms} ms")
        return found
    if next(table.ancestry(snapshot_id), None) is None:
        raise ConfigError(f"--from-snapshot: table {table.identifier} has no snapshot {snapshot_id}")
    return snapshot_id


def _check_retained(pipeline: Opened, start: Found) -> None:
    view = pipeline.source.describe()
    missing = [
        f"{tp} [{offset}, {view.partitions[tp].low})"
        for tp, offset in sorted(start.ledger.offsets.items())
        if tp in view.partitions and offset < view.partitions[tp].low
    ]
    if missing:
        raise ReplayImpossible(
            f"replay from snapshot {start.snapshot_id} refused: Kafka no longer holds offsets {', '.join(missing)} "
            "(deleted by retention). Nothing was changed. Replay from a later snapshot."
        )


def _check_redrives(pipeline: Opened, target: int, start: Found) -> None:
    """Refuse to replay from ``target`` if a redrive since moved dead letters of records before it
    to the rows: going back to it drops those rows, and the dead letters are gone (re-reading
    starts at its ledger, past them)."""
    name = pipeline.config.pipeline
    for snap in pipeline.rows.ancestry(pipeline.rows.branch_head(MAIN)):
        if snap.snapshot_id == target:
            return
        found = find_ledger(name, [snap])
        redriven = found.ledger.sync.redriven if found is not None and found.ledger.sync is not None else None
        below = sorted(
            str(tp) for tp, spans in (redriven or {}).items() if spans[0][0] < start.ledger.offsets.get(tp, 0)
        )
        if below:
            raise ReplayImpossible(
                f"replay from snapshot {target} refused: `ingest redrive` committed dead letters of records before it "
                f"to the rows in snapshot {snap.snapshot_id} ({', '.join(below)}); going back to it would lose them "
                "(their dead letters are removed, and the replay reads on from its ledger). Nothing was changed. "
                f"Replay from snapshot {snap.snapshot_id} or a later one."
            )


def replay(
    run: Run,
    snapshot_id: int | None = None,
    as_of_ms: int | None = None,
    publish: bool = False,
    rollback: bool = False,
) -> ReplayResult:
    pipeline = run.pipeline
    rows = pipeline.rows
    rows.refresh()
    branch = f"replay-{snapshot_id}"
    if (
        snapshot_id is not None
        and not rollback
        and rows.branch_head(branch) is not None
        and not _left_after_publish(pipeline, branch)
    ):
        # the replay's branch exists: it continues from its own ledger (S itself may be expired by now)
        return _continue(run, snapshot_id, publish)
    target = resolve_snapshot(rows, snapshot_id, as_of_ms)
    if rollback:
        return roll_back(pipeline, target)
    start = _start(pipeline, target)
    branch = f"replay-{target}"
    if rows.branch_head(branch) is None:
        try:
            rows.commit(MoveRef(branch, target, expected=None))
        except (CommitConflict, CommitUnknown):  # a concurrent copy of this command created it, or S expired
            rows.refresh()
            if rows.branch_head(branch) is None:
                raise ReplayImpossible(
                    f"cannot create branch {branch}: snapshot {target} is no longer in table {rows.identifier} "
                    "(expired meanwhile). Nothing was changed; replay from a later snapshot."
                ) from None
    return replace(_continue(run, target, publish, start), ledger_batch=start.ledger.batch)


def _left_after_publish(pipeline: Opened, branch: str) -> bool:
    """Whether ``branch`` of the rows table is one a publish made main and could not remove (its
    head, the publish's stamp, is on main's line); it is removed now, and the replay begins anew:
    continuing it would commit on a line main has moved on from, its dead letters on no branch.
    Raises :class:`MainMoved` (retryable) if it cannot be removed."""
    rows, name = pipeline.rows, pipeline.config.pipeline
    head = rows.branch_head(branch)
    stamp = next(rows.ancestry(head), None) if head is not None else None
    if stamp is None or read_extra(name, stamp.summary, "restamped-by") != "publish":
        return False
    if all(snap.snapshot_id != head for snap in rows.ancestry()):
        return False
    log.info("branch %s of %s was published and left behind; removing it to replay anew", branch, rows.identifier)
    main = observe(rows, name)  # the publish's dead-letter step first, if it is still owed: it needs the branch
    settle(pipeline.dead, rows, pipeline.config, main.ledger if main else None, attempts(pipeline))
    remove_branch(rows, branch)
    remove_branch(pipeline.dead, branch)
    rows.refresh()
    if rows.branch_head(branch) is not None:
        raise MainMoved(
            f"branch {branch} of {rows.identifier}, published earlier, could not be removed to replay anew. Nothing "
            "was changed; run the replay again."
        )
    return True


def roll_back(pipeline: Opened, target: int) -> ReplayResult:
    """``ingest replay --rollback`` to snapshot ``target`` of the rows table: main points at it again
    (restamped with the dead-letter rewind it owes), and the runs continue from its ledger."""
    start = _start(pipeline, target)
    main, discarded = _rollback(pipeline, target, start)
    return ReplayResult(
        pipeline.config.pipeline,
        target,
        "rolled-back",
        start.ledger.batch,
        main=main,
        discarded_foreign=tuple(discarded),
    )


def _start(pipeline: Opened, target: int) -> Found:
    """The ledger a replay or rollback to snapshot ``target`` starts from, once main's head owes the
    dead-letter table nothing and Kafka still holds every record after it."""
    name = pipeline.config.pipeline
    rows = pipeline.rows
    head = observe(rows, name)
    # main's head may owe the dead-letter table its step (a batch's dead letters): done before the
    # dead letters are rewound or branched, so what they keep below S is complete
    settle(pipeline.dead, rows, pipeline.config, head.ledger if head else None, attempts(pipeline))
    start = find_ledger(name, rows.ancestry(target))
    if start is None:
        raise ConfigError(
            f"snapshot {target} has no ledger of pipeline {name!r} in its ancestry; nothing to replay from"
        )
    _check_retained(pipeline, start)
    _check_redrives(pipeline, target, start)
    return start


def _continue(run: Run, target: int, publish: bool, start: Found | None = None) -> ReplayResult:
    """Catch branch ``replay-<target>`` up, then compare it with main or publish it."""
    pipeline = run.pipeline
    branch = f"replay-{target}"
    dead_letters_ready(pipeline, branch, target, start)
    replaying = run.on_branch(branch)
    batches = tuple(replaying.batches(until_caught_up=True))
    name = pipeline.config.pipeline
    if publish:
        head, reapplied = _publish(pipeline, replaying, branch, target)
        return ReplayResult(
            name, target, "published", branch=branch, batches=batches, published=head, reapplied=reapplied
        )
    return ReplayResult(name, target, "replayed", branch=branch, batches=batches, comparison=compare(pipeline, branch))


def _rollback(pipeline: Opened, target: int, start: Found) -> tuple[int | None, list[Discarded]]:
    """Point main at a marker snapshot on top of ``target`` (S's ledger, and the dead-letter
    rewind it owes), requiring main's head to be the one this decision was made on; then rewind
    the dead letters."""
    rows = pipeline.rows
    name = pipeline.config.pipeline
    main_head = rows.branch_head(MAIN)
    orphaned = [
        other
        for other in registered_pipelines(rows.head().properties)
        if other != name and find_ledger(other, rows.ancestry(target)) is None
    ]
    if orphaned:
        raise RollbackRefused(
            f"rolling {rows.identifier} back to snapshot {target} would lose the ledger of pipeline(s) "
            f"{', '.join(orphaned)} (they first committed after it). Nothing was changed. Replay into a branch "
            "and publish instead (publish keeps their commits)."
        )
    discarded: list[Discarded] = []  # other writers' commits main loses (their rows come back, or go)
    for snap in rows.ancestry(main_head):
        if snap.snapshot_id == target:
            break
        if find_ledger(name, [snap]) is None:
            discarded.append(Discarded(snap.snapshot_id, snap.operation))
    to, gaps = rewind_of(start.ledger)
    sync = DeadLetterSync(f"rollback-{target}-{uuid.uuid4().hex[:12]}", rewind_to=to, rewind_gaps=gaps or None)
    staging = f"rollback-{target}"
    try:
        rows.commit(MoveRef(staging, target, expected=rows.branch_head(staging)))
        at_s = rows.on_branch(staging)
        at_s.commit(Append([], encode(name, marker(start.ledger, sync), BatchCounts(), {"restamped-by": "rollback"})))
        new_head = at_s.branch_head(staging)
        assert new_head is not None
        rows.commit(MoveRef(MAIN, new_head, expected=main_head))
    except (CommitConflict, CommitUnknown) as error:
        rows.refresh()
        found = find_ledger(name, rows.ancestry())
        if (found is None or found.ledger.sync != sync) and next(rows.ancestry(target), None) is None:
            raise ReplayImpossible(
                f"rollback of {rows.identifier} to snapshot {target} not applied: the snapshot was expired meanwhile "
                f"({error}). Nothing was changed; roll back to a later snapshot (ingest history lists them)."
            ) from None
        if found is None or found.ledger.sync != sync:
            raise MainMoved(
                f"rollback of {rows.identifier} to snapshot {target} not applied: main moved while it was decided "
                f"({error}). Nothing was changed; run the same command again."
            ) from None
    finally:
        rows.refresh()
        staged = rows.branch_head(staging)
        if staged is not None:
            settled(lambda: rows.commit(RemoveRef(staging, staged)), rows)
    failpoints.reach("between-tables")
    settle(pipeline.dead, rows, pipeline.config, marker(start.ledger, sync), attempts(pipeline))
    return rows.branch_head(MAIN), discarded


def _forked_from_main(rows: IcebergTable, branch: str, target: int) -> None:
    """Refuse to publish ``branch`` unless main still holds the snapshot it forked at (``target``):
    a rollback since then (this pipeline's or another's) took main back past it, or another
    replay's publish replaced main's line. The branch holds rows main no longer has, under ledgers
    main no longer has; publishing it would bring them back beside the records read again since."""
    if any(snap.snapshot_id == target for snap in rows.ancestry(rows.branch_head(MAIN))):
        return
    raise PublishRefused(
        f"publish of {branch} on {rows.identifier} refused: main no longer holds snapshot {target}, where the "
        "replay began (a rollback took main back past it, or another replay was published, since). Publishing "
        "would bring back rows main has dropped. Nothing was changed and the branch is kept for audit; replay "
        "again from a snapshot main holds now (ingest history lists them)."
    )


def _publish(pipeline: Opened, replaying: Run, branch: str, target: int) -> tuple[int | None, int]:
    """Fast-forward main to the branch once the branch holds everything main holds, then the
    dead-letter table to its branch (see :mod:`ingest.dead_letters`)."""
    name = pipeline.config.pipeline
    rows = pipeline.rows
    reapplied = 0

    def attempt(number: int) -> tuple[int | None, int]:
        nonlocal reapplied
        main = observe(rows, name)  # refreshes: the swap requires this main head
        head = rows.branch_head(branch)
        if head is None and main is not None and main.ledger.sync is not None and main.ledger.sync.branch == branch:
            # another copy of this command published it (main took the branch's place): its steps are done
            settle(pipeline.dead, rows, pipeline.config, main.ledger, attempts(pipeline))
            return rows.branch_head(MAIN), reapplied
        replayed = find_ledger(name, rows.ancestry(head)) if head is not None else None
        # named by the branch's newest batch: a later replay from the same snapshot publishes anew
        sync = DeadLetterSync(f"publish-{branch}-{replayed.snapshot_id if replayed else None}", branch=branch)
        behind = main is not None and (
            replayed is None
            or any(replayed.ledger.offsets.get(tp, -1) < offset for tp, offset in main.ledger.offsets.items())
        )
        if behind or replayed is None:
            for _result in replaying.batches(until_caught_up=True):
                pass
            raise Again(f"branch {branch} was behind main; caught up")
        _forked_from_main(rows, branch, target)
        dead = pipeline.dead
        dead.refresh()
        if dead.branch_head(branch) is not None:  # its publish must be possible before the rows' is made
            carryable(dead, name, branch)
        # the branch head's own step (its batch's dead letters) before the publish marker replaces it
        on_dead_branch = replaying.pipeline
        settle(on_dead_branch.dead, on_dead_branch.rows, pipeline.config, replayed.ledger, attempts(pipeline))
        main_head = rows.branch_head(MAIN)
        moving = None
        try:
            reapplied += carry_over(rows, name, branch)
            # the snapshot main moves to says what the dead-letter table owes it, and keeps every
            # other pipeline's ledger main holds
            on_branch = rows.on_branch(branch)
            stamp = encode(name, marker(replayed.ledger, sync), BatchCounts(), {"restamped-by": "publish"})
            on_branch.commit(Append([], {**main_ledgers(rows, name, branch), **stamp}))
            moving = on_branch.branch_head(branch)
            assert moving is not None
            # main takes the branch's place in one swap: a batch of another copy of this command
            # cannot land on the branch once main has left it (its dead letters would follow main)
            rows.commit(MoveRef(MAIN, moving, expected=main_head, drop=branch))
        except (CommitConflict, CommitUnknown):
            rows.refresh()
            if moving is None or rows.branch_head(MAIN) != moving or rows.branch_head(branch) is not None:
                raise  # main or the branch moved in between: catch up and carry over again
        failpoints.reach("between-tables")
        settle(pipeline.dead, rows, pipeline.config, marker(replayed.ledger, sync), attempts(pipeline))
        return moving, reapplied

    return with_retries(
        attempt,
        PUBLISH_ATTEMPTS,
        lambda: MainMoved(
            f"publish of {branch} refused {PUBLISH_ATTEMPTS} times: main keeps moving. The branch is caught up "
            "and intact; pause the scheduled runs of this pipeline and run the replay with --publish again."
        ),
        f"publish of {branch} on {rows.identifier}",
    )
