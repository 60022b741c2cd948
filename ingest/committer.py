"""The compare-and-swap commit loop shared by every engine.

Each attempt re-observes the branch head's ledger and lets the pure core decide
(:func:`ingest.core.commit.decide`). A conflict or an unknown outcome never retries the same
append blindly: it loops to the next observation, which settles whether the batch landed,
must be committed again, or was fenced by another writer. Attempts are bounded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.commit import Decision, dead_letter_step, decide
from ingest.core.ledger import (
    REGISTRY_PROPERTY,
    BatchCounts,
    Found,
    Ledger,
    TopicPartition,
    encode,
    find_ledger,
    offsets_key,
    register,
    registered_pipelines,
)
from ingest.core.plan import Batch
from ingest.errors import CommitGaveUp, LedgerLost
from ingest.ports import DataFile, LedgerTable
from ingest.records import DEAD_LETTERS
from ingest.retry import settled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowsCommit:
    """A batch's data files and the ledger they end at, to be committed in one snapshot, exactly once."""

    pipeline: str
    batch: Batch
    #: the ledger the snapshot carries (normally ``batch.ledger(...)``)
    ledger: Ledger
    files: Sequence[DataFile]
    counts: BatchCounts
    max_attempts: int
    #: further summary keys of this pipeline (``ingest.<pipeline>.<key>``)
    extra: Mapping[str, str] = field(default_factory=dict)
    #: ``ingest reset`` only: commit over a lost ledger as if there were none (``batch.base`` is None)
    recovering: bool = False


@dataclass(frozen=True)
class DeadLettersCommit:
    """A batch's dead letters, to be added to the dead-letter table but for those it holds already."""

    pipeline: str
    batch: Batch
    dead_letters: pa.Table
    max_attempts: int
    #: the rows table: its ledger must still be the batch's base for the dead letters to go in
    rows: LedgerTable | None = None


@dataclass(frozen=True)
class FloorCommit:
    """A batch's rows for one of the tables ``route_by`` names, cut at that table's floor."""

    pipeline: str
    batch: Batch
    files: Sequence[DataFile]
    #: the table's floor the files were cut at (None: it had none); rows below it are not in them
    floor: Mapping[TopicPartition, int] | None
    max_attempts: int


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    snapshot_id: int | None


def observe(table: LedgerTable, pipeline: str, max_age_s: float = 0.0, *, recovering: bool = False) -> Found | None:
    """The head's ledger for ``pipeline``; fails closed if the table knows it but lost its ledger.

    The metadata is loaded again unless the handle's came from the catalog less than
    ``max_age_s`` ago (``math.inf``: whatever the handle holds).
    ``recovering=True`` reads a lost ledger as no ledger instead: only ``ingest reset`` passes it,
    because a reset is the operator's explicit statement of where to resume.
    """
    table.refresh(max_age_s)
    found = find_ledger(pipeline, table.ancestry())
    if not recovering and ledger_lost(table, pipeline, found):
        raise LedgerLost(pipeline, table.identifier, REGISTRY_PROPERTY, offsets_key(pipeline))
    return found


def ledger_lost(table: LedgerTable, pipeline: str, found: Found | None) -> bool:
    """Whether ``pipeline`` committed to ``table`` (its registry says so) although ``found``, the
    ledger lookup on the handle's metadata, found none."""
    return found is None and pipeline in registered_pipelines(table.head().properties)


def _decide(table: LedgerTable, request: RowsCommit, held: bool) -> tuple[Found | None, Decision]:
    """Observe and decide; with ``held``, a COMMIT decided on the handle's metadata is enough
    (the head requirement guards it), anything else is settled on freshly loaded metadata."""
    if held:
        found = observe(table, request.pipeline, math.inf, recovering=request.recovering)
        if decide(found.ledger if found else None, request.batch) is Decision.COMMIT:
            return found, Decision.COMMIT
    found = observe(table, request.pipeline, recovering=request.recovering)
    return found, decide(found.ledger if found else None, request.batch)


def commit_rows(table: LedgerTable, request: RowsCommit) -> Outcome:
    """Commit a batch's data files and its end ledger in one snapshot, exactly once.

    The first of several attempts may commit on the metadata the handle already holds (normally
    what the batch was planned from) instead of loading it again: the commit requires that head,
    so a stale view can only conflict, and the next attempt observes afresh.
    """
    summary = encode(request.pipeline, request.ledger, request.counts, request.extra)

    def attempt(number: int) -> Outcome:
        held = number == 1 and request.max_attempts > 1
        found, decision = _decide(table, request, held)
        if decision is not Decision.COMMIT:
            return Outcome(decision, found.snapshot_id if found else None)
        props = register(table.head().properties, request.pipeline)
        return Outcome(Decision.COMMIT, table.try_commit(request.files, summary, props))

    return settled(
        attempt,
        request.max_attempts,
        lambda: CommitGaveUp(
            f"batch {request.batch.number} of {request.pipeline!r}: the commit to {table.identifier} did not "
            f"settle after {request.max_attempts} attempts (catalog contention or errors). Nothing was "
            "duplicated; run again."
        ),
        f"the commit of batch {request.batch.number} to {table.identifier}",
    )


def commit_dead_letters(table: LedgerTable, request: DeadLettersCommit) -> int:
    """Add the batch's dead letters that the dead-letter table does not hold yet; returns how many.

    Runs before the rows commit. The dead letters at or above the dead-letter ledger (the floor,
    :class:`ingest.core.commit.DeadLetterStep`) are added as they are; those below it (a re-run
    after a crash between the two commits, a concurrent copy, a re-read after a reset) are looked
    up in the table at the head the commit requires. So nothing is added twice and nothing is
    dropped, whatever decoding wrote the dead letters there. Those below the floor go in only while
    the rows ledger is still the batch's base: a batch that landed already (its dead letters went
    in before its rows) or was fenced (it plans again) adds none, so a late copy cannot put back a
    dead letter ``ingest redrive`` has moved to the rows. A batch whose dead letters all lie above
    the floor (the usual case) reads the rows table only for its own commit.
    """
    if request.dead_letters.num_rows == 0:
        return 0
    batch, pipeline = request.batch, request.pipeline
    written: tuple[pa.Table, list[DataFile]] | None = None

    def attempt(number: int) -> int:
        nonlocal written
        found = observe(table, pipeline)  # first: a redrive's removal after this makes the commit conflict
        step = dead_letter_step(found.ledger if found else None, batch)
        if request.rows is not None and _any_below(request.dead_letters, step.floor):
            # dead letters to look up: a redrive may have moved some to the rows since this batch's
            # copy that landed put them here; none goes in unless the batch is still to land
            rows = observe(request.rows, pipeline)
            if decide(rows.ledger if rows else None, batch) is not Decision.COMMIT:
                return 0
        kept = _not_held(table, request.dead_letters, step.floor)
        if written is None or not written[0].equals(_coordinates(kept)):
            written = (_coordinates(kept), table.write(kept))
        if kept.num_rows == 0:
            return 0
        ledger = Ledger(
            batch=(found.ledger.batch + 1) if found else 1,
            offsets=step.new_floor,
            start_offsets=batch.start,
            cluster_id=batch.cluster_id,
        )
        summary = encode(pipeline, ledger, BatchCounts(dead_letters=kept.num_rows))
        table.try_commit(written[1], summary, register(table.head().properties, pipeline))
        return int(kept.num_rows)

    return settled(
        attempt,
        request.max_attempts,
        lambda: CommitGaveUp(
            f"batch {batch.number} of {pipeline!r}: the dead-letter commit to {table.identifier} did not settle "
            f"after {request.max_attempts} attempts. Nothing was duplicated; run again."
        ),
        f"the dead-letter commit of batch {batch.number} to {table.identifier}",
    )


def commit_floor(table: LedgerTable, request: FloorCommit) -> bool:
    """Commit a batch's rows to a routed table with its floor moved to ``max(floor, batch end)``,
    exactly once; False if the floor is no longer the one the files were cut at (another copy of
    the batch, or a later one, committed rows there since: the batch plans again).

    The floor says the table holds every record routed to it below it. The files hold the batch's
    rows at or past the floor they were cut at, so committing them on that floor keeps it true. A
    floor already at the new one is the same rows landed (this attempt's lost acknowledgement, or a
    copy that read the same records): nothing to do.
    """
    batch, pipeline = request.batch, request.pipeline
    cut = dict(request.floor) if request.floor is not None else None
    new_floor = dict(cut or {})
    for tp, end in batch.end.items():
        new_floor[tp] = max(new_floor.get(tp, end), end)
    records = sum(f.record_count for f in request.files)

    def attempt(number: int) -> bool:
        found = observe(table, pipeline)
        now = dict(found.ledger.offsets) if found is not None else None
        if now == new_floor:
            return True
        if now != cut:
            return False
        ledger = Ledger(
            batch=(found.ledger.batch + 1) if found else 1,
            offsets=new_floor,
            start_offsets=batch.start,
            cluster_id=batch.cluster_id,
        )
        summary = encode(pipeline, ledger, BatchCounts(records=records))
        table.try_commit(request.files, summary, register(table.head().properties, pipeline))
        return True

    return settled(
        attempt,
        request.max_attempts,
        lambda: CommitGaveUp(
            f"batch {batch.number} of {pipeline!r}: the commit to {table.identifier} did not settle after "
            f"{request.max_attempts} attempts. Nothing was duplicated; run again."
        ),
        f"the commit of batch {batch.number} to {table.identifier}",
    )


def _coordinates(dead_letters: pa.Table) -> pa.Table:
    """The coordinate columns (what tells dead letters apart)."""
    c = DEAD_LETTERS
    return dead_letters.select([c.topic, c.partition, c.offset])


def _any_below(dead_letters: pa.Table, floor: Mapping[TopicPartition, int]) -> bool:
    """Whether any of ``dead_letters`` lies below ``floor``."""
    c = DEAD_LETTERS
    for tp, at in floor.items():
        mine = pc.and_(pc.equal(dead_letters[c.topic], tp.topic), pc.equal(dead_letters[c.partition], tp.partition))
        if pc.any(pc.and_(mine, pc.less(dead_letters[c.offset], at))).as_py():
            return True
    return False


def _not_held(table: LedgerTable, dead_letters: pa.Table, floor: Mapping[TopicPartition, int]) -> pa.Table:
    """``dead_letters`` but for those ``table`` holds already: none at or above ``floor``, the ones
    below it looked up (at the head the handle holds)."""
    c = DEAD_LETTERS
    below = pa.array([False] * dead_letters.num_rows, pa.bool_())
    offsets = dead_letters[c.offset]
    spans: dict[TopicPartition, list[tuple[int, int]]] = {}
    for tp, at in floor.items():
        mine = pc.and_(pc.equal(dead_letters[c.topic], tp.topic), pc.equal(dead_letters[c.partition], tp.partition))
        under = pc.and_(mine, pc.less(offsets, at))
        if pc.any(under).as_py():
            looked = pc.filter(offsets, under)
            spans[tp] = [(pc.min(looked).as_py(), pc.max(looked).as_py() + 1)]
            below = pc.or_(below, under)
    if not spans:
        return dead_letters
    found = table.dead_letter_coordinates(spans)
    held = pa.array([False] * dead_letters.num_rows, pa.bool_())
    for tp in spans:
        mine = pc.and_(pc.equal(found[c.topic], tp.topic), pc.equal(found[c.partition], tp.partition))
        there = found.filter(mine)[c.offset].combine_chunks()
        same = pc.and_(pc.equal(dead_letters[c.topic], tp.topic), pc.equal(dead_letters[c.partition], tp.partition))
        held = pc.or_(held, pc.and_(below, pc.and_(same, pc.is_in(offsets, there))))
    return dead_letters.filter(pc.invert(held))
