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
carries a :class:`~ingest.core.ledger.DeadLetterSync` marker. Every batch on main settles the
marker before it commits anything (:func:`settle`), and the dead-letter ledger remembers the
marker's id once the step is done, so a crash between the two tables is finished by whichever
comes next (the same command again, or the next scheduled run), exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ingest.committer import observe
from ingest.config import PipelineConfig
from ingest.core.ledger import (
    RESET_MEMORY,
    AppliedReset,
    BatchCounts,
    DeadLetterSync,
    Ledger,
    TopicPartition,
    carried,
    encode,
)
from ingest.errors import CommitGaveUp
from ingest.iceberg.table import MAIN, IcebergTable
from ingest.lineage import carry_over, remove_branch
from ingest.retry import settled

log = logging.getLogger(__name__)


def _remembering(ledger: Ledger, sync_id: str) -> tuple[AppliedReset, ...]:
    return (*carried(ledger), AppliedReset(sync_id))[-RESET_MEMORY:]


def rewind(
    dead: IcebergTable,
    pipeline: str,
    topics: Sequence[str],
    to: Mapping[TopicPartition, int],
    sync_id: str,
    max_attempts: int,
) -> None:
    """Remove ``pipeline``'s dead letters at or past ``to`` on ``dead``'s branch and set its floor
    to ``to``, in one commit that remembers ``sync_id``; a no-op once remembered."""
    topics = sorted({*topics, *(tp.topic for tp in to)})

    def attempt(number: int) -> None:
        found = observe(dead, pipeline, recovering=True)
        if found is not None and found.ledger.remembers(sync_id):
            return
        # and every topic the floor names: a topic first read after the ledger ``to`` came from
        # (``topics_pattern:`` matched it since) is not in ``to``, and all its dead letters go
        every = sorted({*topics, *(found.ledger.topics if found is not None else ())})
        ledger = Ledger(
            batch=found.ledger.batch + 1 if found else 1,
            offsets=dict(to),
            start_offsets=dict(to),
            cluster_id=found.ledger.cluster_id if found else None,
            resets=_remembering(found.ledger, sync_id) if found else (AppliedReset(sync_id),),
        )
        dead.rewind(every, to, encode(pipeline, ledger, BatchCounts(), extra={"synced-by": sync_id}))

    settled(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"rewinding the dead letters of {pipeline!r} in {dead.identifier} ({sync_id}) did not settle after "
            f"{max_attempts} attempts. Nothing was lost; run the same command again."
        ),
        f"dead-letter rewind {sync_id} on {dead.identifier}",
    )


def publish_branch(dead: IcebergTable, pipeline: str, branch: str, sync_id: str, max_attempts: int) -> None:
    """Make dead-letter branch ``branch`` main (carrying other writers' appends over), remembering
    ``sync_id`` on it, then remove the branch; a no-op once main remembers ``sync_id``."""

    def attempt(number: int) -> None:
        main = observe(dead, pipeline, recovering=True)
        if main is not None and main.ledger.remembers(sync_id):
            remove_branch(dead, branch)
            return
        head, main_head = dead.branch_head(branch), dead.branch_head(MAIN)
        if head is None:  # a replay begun before dead letters had branches: they stayed on main
            _stamp(dead, pipeline, main.ledger if main else None, sync_id)
            return
        carry_over(dead, pipeline, branch)
        on_branch = dead.on_branch(branch)
        found = observe(on_branch, pipeline, recovering=True)
        _stamp(on_branch, pipeline, found.ledger if found else None, sync_id)
        # requires the main head carry_over looked at: a commit since then makes it look again
        dead.set_ref(MAIN, on_branch.branch_head(branch) or head, expected=main_head)
        remove_branch(dead, branch)

    settled(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"publishing dead-letter branch {branch} of {dead.identifier} did not settle after {max_attempts} "
            "attempts (other writers kept committing). Nothing was lost; run the same command again."
        ),
        f"dead-letter publish of {branch} on {dead.identifier}",
    )


def remove_redriven(
    dead: IcebergTable,
    pipeline: str,
    redriven: Mapping[TopicPartition, Sequence[tuple[int, int]]],
    sync_id: str,
    max_attempts: int,
) -> None:
    """Remove the dead letters ``ingest redrive`` committed to the rows table (``redriven``), in one
    commit that remembers ``sync_id`` and records what it removed; a no-op once remembered. The
    floor stays where it is: these records are stored, in the rows now."""

    def attempt(number: int) -> None:
        found = observe(dead, pipeline, recovering=True)
        if found is not None and found.ledger.remembers(sync_id):
            return
        base = found.ledger if found is not None else Ledger(batch=0, offsets={})
        # the offsets whose dead letters the table holds stay as they were: the removed ones are in the rows now
        ledger = replace(base, batch=base.batch + 1, resets=_remembering(base, sync_id), sync=None)
        removed = sum(hi - lo for spans in redriven.values() for lo, hi in spans)
        extra = {"synced-by": sync_id, "redriven": str(removed)}
        dead.remove_dead_letters(redriven, encode(pipeline, ledger, BatchCounts(), extra=extra))

    settled(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"removing the re-driven dead letters of {pipeline!r} from {dead.identifier} ({sync_id}) did not "
            f"settle after {max_attempts} attempts. Nothing was lost; run `ingest redrive` again (or the next run "
            "finishes it)."
        ),
        f"dead-letter removal {sync_id} on {dead.identifier}",
    )


def _stamp(table: IcebergTable, pipeline: str, ledger: Ledger | None, sync_id: str) -> None:
    """A snapshot without data on ``table``'s branch whose ledger (unchanged) remembers ``sync_id``."""
    base = ledger if ledger is not None else Ledger(batch=0, offsets={})
    stamped = replace(base, resets=_remembering(base, sync_id), reset_id=None, sync=None)
    table.try_commit([], encode(pipeline, stamped, BatchCounts(), extra={"synced-by": sync_id}), {})


def settle(dead: IcebergTable, config: PipelineConfig, ledger: Ledger | None, attempts: int) -> None:
    """Do what the dead-letter table owes the rows ledger ``ledger`` (a marker's step), if anything,
    for ``config``'s pipeline and its topics among ``ledger``'s.

    Called before every commit made on top of ``ledger`` on the rows table's main."""
    sync = ledger.sync if ledger is not None else None
    if ledger is None or sync is None:
        return
    pipeline, topics = config.pipeline, config.topics_in(ledger.topics)
    if sync.redriven is not None:
        remove_redriven(dead, pipeline, sync.redriven, sync.sync_id, attempts)
    elif sync.branch is not None:
        publish_branch(dead, pipeline, sync.branch, sync.sync_id, attempts)
    elif sync.rewind_to is not None:
        rewind(dead, pipeline, topics, sync.rewind_to, sync.sync_id, attempts)


def marker(ledger: Ledger, sync: DeadLetterSync) -> Ledger:
    """``ledger`` unchanged but for the marker: the rows snapshot that makes the jump carries it."""
    return replace(ledger, sync=sync, reset_id=None)
