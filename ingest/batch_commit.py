"""A batch's commit to its two tables: the rows with the ledger first, then its dead letters.

Two tables cannot commit atomically, so one of them decides: the rows table, whose ledger says
which records the pipeline has stored. A batch's dead letters are written to data files first
(nothing is visible yet); the rows commit, a compare-and-swap on the ledger, carries their paths
in a marker (:class:`~ingest.core.ledger.DeadLetterSync` with ``files``); only once it has landed
are they added to the dead-letter table, by this copy or by whichever run comes next
(:func:`land_dead_letters`, which :func:`ingest.dead_letters.settle` calls for every marker). So
of several copies that read the same records, under the same decoding or not, only the one whose
rows commit won adds dead letters: a record is in the rows or the dead letters exactly once.

Adding them is itself a compare-and-swap on the dead-letter table, and is owed only while the
rows branch's ledger still carries the marker (a rollback or a publish that moved the rows off it
discards it, rows and dead letters alike). It observes the dead-letter table before it looks at
the rows, and every command that moves the rows off a marker changes the dead-letter table after
that, so an addition decided on a marker that was just left behind conflicts instead of landing.
The dead-letter ledger remembers the marker's id once the files are in: adding them is done once.

The dead-letter ledger's offsets are a floor: no dead letter lies at or above them. A batch's dead
letters below the floor (a range read again after a backward reset) are looked up before they are
written, so none is stored twice (:func:`stage_dead_letters`).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest import failpoints
from ingest.changes import KeyDeletes
from ingest.committer import RowsCommit, commit_rows, observe
from ingest.core.commit import Decision, dead_letter_step
from ingest.core.ledger import BatchCounts, DeadLetterSync, Ledger, TopicPartition, remembering
from ingest.core.ledger_codec import encode, encode_sync, owed_property, register
from ingest.core.plan import Batch
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.errors import CommitGaveUp
from ingest.intents import Append, DataFile
from ingest.ports import LedgerTable
from ingest.records import DEAD_LETTERS
from ingest.retry import with_retries

log = logging.getLogger(__name__)


class FloorTables(Protocol):
    """Tables committed to before the ledger's, each on a floor of its own (``route_by``'s)."""

    def commit(self, batch: Batch, files: Sequence[DataFile]) -> bool:
        """Commit each table's share of ``files``; False if a floor moved since they were cut."""
        ...


@dataclass(frozen=True)
class BatchCommit:
    """A produced batch, to be committed exactly once: its rows and ledger, then its dead letters."""

    pipeline: str
    batch: Batch
    #: the ledger the rows snapshot carries (``batch.ledger(...)``; the marker is added here)
    ledger: Ledger
    files: Sequence[DataFile]
    dead_letters: DeadLetterSpool
    counts: BatchCounts
    max_attempts: int
    #: further summary keys of this pipeline on the rows snapshot (``ingest.<pipeline>.<key>``)
    extra: Mapping[str, str] = field(default_factory=dict)
    #: a changelog batch's: the keys whose live rows its snapshot deletes
    deletes: KeyDeletes | None = None


@dataclass(frozen=True)
class Committed:
    """A batch that is in: committed now (``COMMIT``) or found landed already (``LANDED``)."""

    decision: Decision
    snapshot_id: int | None
    #: this copy's dead letters of the batch now in the dead-letter table (0 if another copy's
    #: commit of the batch landed: its dead letters are the ones stored)
    dead_letters: int
    #: the marker whose dead letters this call added (or found added), if any
    landed_sync: str | None = None


@dataclass(frozen=True)
class Staged:
    """A batch's dead letters written to files, and the marker its rows commit carries for them."""

    marker: DeadLetterSync | None
    files: Sequence[DataFile]


def commit_batch(
    rows: LedgerTable, dead: LedgerTable, request: BatchCommit, floors: FloorTables | None = None
) -> Committed | None:
    """Commit ``request``'s rows with its ledger (and the marker of its dead letters), then add its
    dead letters; None if another writer fenced the batch (plan again).

    Call it once the marker of the batch's base, if any, is settled (:func:`ingest.dead_letters.settle`):
    the dead letters are looked up against the dead-letter table as that leaves it."""
    staged = stage_dead_letters(dead, request.pipeline, request.batch, request.dead_letters)
    files = request.files
    if floors is not None:
        if not floors.commit(request.batch, files):
            return None  # another copy moved a routed table's floor since these files were cut: plan again
        files = []  # the ledger's table holds no rows
    ledger = replace(request.ledger, sync=staged.marker)
    outcome = commit_rows(
        rows,
        RowsCommit(
            request.pipeline,
            request.batch,
            ledger,
            files,
            request.counts,
            request.max_attempts,
            request.extra,
            properties={owed_property(request.pipeline): encode_sync(staged.marker)} if staged.marker else {},
            deletes=request.deletes,
        ),
    )
    if outcome.decision is Decision.FENCED:
        return None
    failpoints.reach("between-commits")
    head = outcome.ledger
    mine = staged.marker is not None and head is not None and head.sync == staged.marker
    landed = 0
    if head is not None:
        landed = land_dead_letters(
            dead,
            rows,
            request.pipeline,
            head,
            request.max_attempts,
            written=staged.files if mine else None,
            just_committed=outcome.decision is Decision.COMMIT,
        )
    sync = head.sync.sync_id if head is not None and head.sync is not None and head.sync.files is not None else None
    count = staged.marker.count if mine and staged.marker is not None else 0
    if mine and landed == 0:
        log.info("batch %d: its dead letters were added by another run", request.batch.number)
    return Committed(outcome.decision, outcome.snapshot_id, count, sync)


def stage_dead_letters(dead: LedgerTable, pipeline: str, batch: Batch, dead_letters: DeadLetterSpool) -> Staged:
    """Write ``dead_letters`` but for those the dead-letter table holds already (below its floor:
    a re-read after a backward reset) to data files, a group at a time, and the marker naming
    them; nothing is visible."""
    if dead_letters.num_rows == 0:
        return Staged(None, [])
    found = observe(dead, pipeline)
    step = dead_letter_step(found.ledger if found else None, batch)
    files: list[DataFile] = []
    count = 0
    for group in dead_letters.groups():
        kept = _not_held(dead, group, step.floor)
        if kept.num_rows:
            files += dead.write(kept)
            count += kept.num_rows
    if count == 0:
        return Staged(None, [])
    marker = DeadLetterSync(
        f"dead-letters-{uuid.uuid4().hex[:16]}", files=tuple(f.file_path for f in files), count=count
    )
    return Staged(marker, files)


def owed(rows: LedgerTable, pipeline: str, sync_id: str) -> bool:
    """Whether the step of marker ``sync_id`` is still owed: the rows branch's ledger, loaded now,
    still carries it (a commit on top of a marker is made only once its step is done, and a
    rollback or publish that leaves it behind discards it)."""
    found = observe(rows, pipeline)
    return found is not None and found.ledger.sync is not None and found.ledger.sync.sync_id == sync_id


def land_dead_letters(
    dead: LedgerTable,
    rows: LedgerTable,
    pipeline: str,
    ledger: Ledger,
    max_attempts: int,
    *,
    written: Sequence[DataFile] | None = None,
    just_committed: bool = False,
) -> int:
    """Add the dead letters the marker of rows ledger ``ledger`` names to the dead-letter table,
    once; returns how many this call added (0: none owed, or added already).

    ``written``: the marker's files as this process wrote them (else they are read back from
    storage). ``just_committed``: this process committed the marker a moment ago after observing
    the dead-letter table (staging): the first attempt then commits on that observation, which a
    later change of the dead-letter table, such as the step of a rollback that left the marker
    behind, makes conflict."""
    sync = ledger.sync
    if sync is None or sync.files is None:
        return 0
    marker: DeadLetterSync = sync
    paths: tuple[str, ...] = sync.files

    def attempt(number: int) -> int:
        fast = number == 1 and just_committed
        found = observe(dead, pipeline, math.inf if fast else 0.0)  # first: see the module docstring
        if found is not None and found.ledger.remembers(marker.sync_id):
            return 0
        if not fast and not owed(rows, pipeline, marker.sync_id):
            return 0
        files = list(written) if written is not None else dead.adopt(paths)
        step = dead_letter_step(found.ledger if found else None, _range_of(ledger))
        landed = Ledger(
            batch=found.ledger.batch + 1 if found else 1,
            offsets=step.new_floor,
            start_offsets=dict(ledger.start_offsets),
            cluster_id=ledger.cluster_id,
            resets=remembering(found.ledger if found else None, marker.sync_id),
        )
        summary = encode(pipeline, landed, BatchCounts(dead_letters=marker.count), {"synced-by": marker.sync_id})
        dead.commit(Append(files, summary, register(dead.head().properties, pipeline)))
        return marker.count

    return with_retries(
        attempt,
        max_attempts,
        lambda: CommitGaveUp(
            f"adding the dead letters of {pipeline!r} ({marker.sync_id}) to {dead.identifier} did not settle after "
            f"{max_attempts} attempts. Nothing was lost or duplicated: the next run of the pipeline adds them."
        ),
        f"the dead letters {marker.sync_id} to {dead.identifier}",
    )


def _range_of(ledger: Ledger) -> Batch:
    """The batch whose commit carries ``ledger`` (its ranges, for the dead-letter floor)."""
    return Batch(ledger.batch, None, ledger.start_offsets, ledger.offsets, ledger.cluster_id)


def _not_held(table: LedgerTable, dead_letters: pa.Table, floor: Mapping[TopicPartition, int]) -> pa.Table:
    """``dead_letters`` but for those ``table`` holds already: none at or above ``floor``, the ones
    below it looked up (at the head the handle holds)."""
    c = DEAD_LETTERS
    below = pa.repeat(pa.scalar(False), dead_letters.num_rows)
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
    held = pa.repeat(pa.scalar(False), dead_letters.num_rows)
    for tp in spans:
        mine = pc.and_(pc.equal(found[c.topic], tp.topic), pc.equal(found[c.partition], tp.partition))
        there = found.filter(mine)[c.offset].combine_chunks()
        same = pc.and_(pc.equal(dead_letters[c.topic], tp.topic), pc.equal(dead_letters[c.partition], tp.partition))
        held = pc.or_(held, pc.and_(below, pc.and_(same, pc.is_in(offsets, there))))
    return dead_letters.filter(pc.invert(held))
