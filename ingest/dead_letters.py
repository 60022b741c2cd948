"""The dead-letter table follows the rows table when a rollback or a replay moves the rows' lineage.

The rows table decides which records a pipeline has stored; every record of a range it holds is
in the rows or in the dead letters exactly once, in whichever the decoding in force when it was
read put it. A rollback to a snapshot with ledger ``L``, or a replay from it, reads the records
from ``L`` on again, maybe under a changed decoding (that is often why one replays). So:

- a **rollback** also removes this pipeline's dead letters at or past ``L`` and sets the
  dead-letter ledger (the floor) to ``L`` (:func:`rewind`);
- a **replay** gives the dead-letter table a branch of the same name, rewound the same way at its
  start; the replay's dead letters go there, and **publish** makes it the dead-letter table's main
  with the same carry-over as the rows (:func:`publish_branch`);
- a **redrive** (``ingest redrive``, :mod:`ingest.ops.redrive`) commits the dead letters that now
  decode to the rows, and then removes them from the dead-letter table (:func:`remove_redriven`).

Two tables cannot change atomically. The rows table moves first, and the rows snapshot it moves to
carries a :class:`~ingest.core.ledger.DeadLetterSync` marker; a batch's own dead letters follow
the same way (:mod:`ingest.batch_commit`). Every batch settles the marker of the ledger it commits
on top of before it commits anything (:func:`settle`), and the dead-letter ledger remembers the
marker's id once the step is done, so a crash between the two tables is finished by whichever
comes next (the same command again, or the next scheduled run), exactly once. A step is owed only
while the rows branch's ledger carries its marker: each step observes the dead-letter table before
it checks that, and commits requiring the head it observed (see :mod:`ingest.batch_commit`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ingest.batch_commit import land_dead_letters, owed
from ingest.carry_over import carry_over, main_ledgers, uncarryable
from ingest.committer import observe
from ingest.config import PipelineConfig
from ingest.core.expiry import MAIN
from ingest.core.ledger import AppliedReset, BatchCounts, DeadLetterSync, Ledger, TopicPartition, remembering
from ingest.core.ledger_codec import encode, register
from ingest.errors import CommitGaveUp, PublishRefused
from ingest.intents import Append, MoveRef, RemoveDeadLetters, RewindDeadLetters, Spans
from ingest.ports import LedgerTable
from ingest.retry import with_retries

log = logging.getLogger(__name__)


def rewind(
    dead: LedgerTable,
    pipeline: str,
    topics: Sequence[str],
    to: Mapping[TopicPartition, int],
    sync_id: str,
    max_attempts: int,
    *,
    rows: LedgerTable | None = None,
    also: Sequence[str] = (),
    gaps: Spans | None = None,
) -> None:
    """Remove ``pipeline``'s dead letters at or past ``to`` (and in ``gaps``) on ``dead``'s branch and set its floor
    to ``to``, in one commit that remembers ``sync_id`` (and the steps ``also`` names, done by the
    dead letters kept); a no-op once remembered, or (``rows``: the rows branch whose marker asks
    for it) once the rows ledger no longer carries the marker."""
    topics = sorted({*topics, *(tp.topic for tp in to)})

    def attempt(number: int) -> None:
        found = observe(dead, pipeline, recovering=True)
        if found is not None and found.ledger.remembers(sync_id):
            return
        if rows is not None and not owed(rows, pipeline, sync_id):
            return
        # and every topic the floor names: a topic first read after the ledger ``to`` came from
        # (``topics_pattern:`` matched it since) is not in ``to``, and all its dead letters go
        every = sorted({*topics, *(found.ledger.topics if found is not None else ())})
        ledger = Ledger(
            batch=found.ledger.batch + 1 if found else 1,
            offsets=dict(to),
            start_offsets=dict(to),
            cluster_id=found.ledger.cluster_id if found else None,
            resets=_remembering_all(found.ledger if found else None, [*also, sync_id]),
        )
        summary = encode(pipeline, ledger, BatchCounts(), extra={"synced-by": sync_id})
        # the pipeline registered on the table in the same commit: it may be its first ledger there,
        # and expiry keeps the ledgers of the pipelines a table registers
        dead.commit(RewindDeadLetters(every, to, summary, gaps or {}, register(dead.head().properties, pipeline)))

    with_retries(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"rewinding the dead letters of {pipeline!r} in {dead.identifier} ({sync_id}) did not settle after "
            f"{max_attempts} attempts. Nothing was lost; run the same command again."
        ),
        f"dead-letter rewind {sync_id} on {dead.identifier}",
    )


def publish_branch(
    dead: LedgerTable, pipeline: str, branch: str, sync_id: str, max_attempts: int, rows: LedgerTable
) -> None:
    """Make dead-letter branch ``branch`` main (carrying other writers' appends over), remembering
    ``sync_id`` on it, and remove the branch in the same swap; a no-op once main remembers
    ``sync_id``, or once the rows ledger (``rows``) no longer carries the marker."""

    def attempt(number: int) -> None:
        main = observe(dead, pipeline, recovering=True)
        if main is not None and main.ledger.remembers(sync_id):
            return  # (the swap that made the branch main removed it)
        if not owed(rows, pipeline, sync_id):
            return
        head, main_head = dead.branch_head(branch), dead.branch_head(MAIN)
        if head is None:  # a replay begun before dead letters had branches: they stayed on main
            _stamp(dead, pipeline, main.ledger if main else None, sync_id)
            return
        listed = uncarryable(dead, pipeline, branch)
        if listed is not None:  # (the publish checked before it moved the rows: they came since)
            raise PublishRefused(
                f"the publish of {branch} moved the rows table's main, and the dead-letter table {dead.identifier} "
                f"owes it the same step; but its main has gained commits that cannot be carried over onto its "
                f"branch {branch}: {listed}. Runs stop here until it is done, so nothing is lost: apply the same "
                f"change to branch {branch} of {dead.identifier} too, fast-forward main to that branch (Spark: "
                f"CALL <catalog>.system.fast_forward('{dead.identifier}', 'main', '{branch}')), then run again."
            )
        carry_over(dead, pipeline, branch)
        on_branch = dead.on_branch(branch)
        found = observe(on_branch, pipeline, recovering=True)
        _stamp(on_branch, pipeline, found.ledger if found else None, sync_id, main_ledgers(dead, pipeline, branch))
        # requires the main head carry_over looked at: a commit since then makes it look again; and
        # removes the branch in the same swap, requiring the head stamped here
        dead.commit(MoveRef(MAIN, on_branch.branch_head(branch) or head, expected=main_head, drop=branch))

    with_retries(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"publishing dead-letter branch {branch} of {dead.identifier} did not settle after {max_attempts} "
            "attempts (other writers kept committing). Nothing was lost; run the same command again."
        ),
        f"dead-letter publish of {branch} on {dead.identifier}",
    )


def remove_redriven(
    dead: LedgerTable,
    pipeline: str,
    redriven: Mapping[TopicPartition, Sequence[tuple[int, int]]],
    sync_id: str,
    max_attempts: int,
    rows: LedgerTable,
) -> None:
    """Remove the dead letters ``ingest redrive`` committed to the rows table (``redriven``), in one
    commit that remembers ``sync_id`` and records what it removed; a no-op once remembered, or once
    the rows ledger (``rows``) no longer carries the marker. The floor stays where it is: these
    records are stored, in the rows now."""

    def attempt(number: int) -> None:
        found = observe(dead, pipeline, recovering=True)
        if found is not None and found.ledger.remembers(sync_id):
            return
        if not owed(rows, pipeline, sync_id):
            return
        base = found.ledger if found is not None else Ledger(batch=0, offsets={})
        # the offsets whose dead letters the table holds stay as they were: the removed ones are in the rows now
        ledger = replace(base, batch=base.batch + 1, resets=remembering(base, sync_id), sync=None)
        removed = sum(hi - lo for spans in redriven.values() for lo, hi in spans)
        extra = {"synced-by": sync_id, "redriven": str(removed)}
        dead.commit(RemoveDeadLetters(redriven, encode(pipeline, ledger, BatchCounts(), extra=extra)))

    with_retries(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"removing the re-driven dead letters of {pipeline!r} from {dead.identifier} ({sync_id}) did not "
            f"settle after {max_attempts} attempts. Nothing was lost; run `ingest redrive` again (or the next run "
            "finishes it)."
        ),
        f"dead-letter removal {sync_id} on {dead.identifier}",
    )


def _stamp(
    table: LedgerTable, pipeline: str, ledger: Ledger | None, sync_id: str, others: Mapping[str, str] | None = None
) -> None:
    """A snapshot without data on ``table``'s branch whose ledger (unchanged) remembers ``sync_id``
    (and which carries ``others``: other pipelines' ledgers re-stamped)."""
    base = ledger if ledger is not None else Ledger(batch=0, offsets={})
    stamped = replace(base, resets=remembering(base, sync_id), reset_id=None, sync=None)
    summary = encode(pipeline, stamped, BatchCounts(), extra={"synced-by": sync_id})
    table.commit(Append([], {**(others or {}), **summary}, register(table.head().properties, pipeline)))


def settle(dead: LedgerTable, rows: LedgerTable, config: PipelineConfig, ledger: Ledger | None, attempts: int) -> int:
    """Do what the dead-letter table owes the rows snapshot whose ledger is ``ledger`` (a marker's
    step), if anything, for ``config``'s pipeline and its topics among ``ledger``'s; returns how
    many dead letters it added. ``rows`` is the rows table's branch that carries the marker.

    Called before every commit made on top of ``ledger``. On a replay's branch only a batch's
    dead letters are owed: the branch begins at a snapshot whose other steps main did."""
    sync = ledger.sync if ledger is not None else None
    if ledger is None or sync is None:
        return 0
    pipeline, topics = config.pipeline, config.topics_in(ledger.topics)
    if sync.files is not None:
        return land_dead_letters(dead, rows, pipeline, ledger, attempts)
    if rows.branch != MAIN:
        return 0
    if sync.redriven is not None:
        remove_redriven(dead, pipeline, sync.redriven, sync.sync_id, attempts, rows)
    elif sync.branch is not None:
        publish_branch(dead, pipeline, sync.branch, sync.sync_id, attempts, rows)
    elif sync.rewind_to is not None:
        rewind(dead, pipeline, topics, sync.rewind_to, sync.sync_id, attempts, rows=rows, gaps=sync.rewind_gaps)
    return 0


def _remembering_all(base: Ledger | None, step_ids: Sequence[str]) -> tuple[AppliedReset, ...]:
    remembered = base
    for step_id in step_ids:
        remembered = replace(remembered or Ledger(batch=0, offsets={}), resets=remembering(remembered, step_id))
    return remembered.resets if remembered is not None else ()


def marker(ledger: Ledger, sync: DeadLetterSync) -> Ledger:
    """``ledger`` unchanged but for the marker: the rows snapshot that makes the jump carries it."""
    return replace(ledger, sync=sync, reset_id=None)
