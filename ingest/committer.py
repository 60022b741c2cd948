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

from ingest.changes import KeyDeletes
from ingest.core.commit import Decision, decide
from ingest.core.ledger import BatchCounts, Found, Ledger, TopicPartition
from ingest.core.ledger_codec import REGISTRY_PROPERTY, encode, find_ledger, offsets_key, register, registered_pipelines
from ingest.core.plan import Batch
from ingest.errors import CommitGaveUp, LedgerLost
from ingest.intents import Append, DataFile, RowDelta
from ingest.ports import LedgerTable
from ingest.retry import with_retries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowsCommit:
    """A batch's data files and the ledger they end at (and, of a changelog batch, the rows it
    deletes), to be committed in one snapshot, exactly once."""

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
    #: table properties the commit sets too
    properties: Mapping[str, str] = field(default_factory=dict)
    #: a changelog batch's: the key columns and every key it touches, whose live rows the same
    #: snapshot deletes (:class:`~ingest.intents.RowDelta`); None: the batch only adds rows
    deletes: KeyDeletes | None = None


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
    #: the ledger the head carries after it: the one committed (COMMIT), or the one found (LANDED, FENCED)
    ledger: Ledger | None = None


#: metadata loaded this recently is current enough to plan a batch from, or to cut its files at a
#: routed table's floor: if another writer moved the head since, the commit conflicts and observes again
HELD_S = 1.0


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
            return Outcome(decision, found.snapshot_id if found else None, found.ledger if found else None)
        props = {**register(table.head().properties, request.pipeline), **request.properties}
        deletes = request.deletes
        intent = (
            Append(request.files, summary, props)
            if deletes is None
            else RowDelta(request.files, deletes.key, deletes.keys, summary, props)
        )
        return Outcome(Decision.COMMIT, table.commit(intent), request.ledger)

    return with_retries(
        attempt,
        request.max_attempts,
        lambda: CommitGaveUp(
            f"batch {request.batch.number} of {request.pipeline!r}: the commit to {table.identifier} did not "
            f"settle after {request.max_attempts} attempts (catalog contention or errors). Nothing was "
            "duplicated; run again."
        ),
        f"the commit of batch {request.batch.number} to {table.identifier}",
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
        table.commit(Append(request.files, summary, register(table.head().properties, pipeline)))
        return True

    return with_retries(
        attempt,
        request.max_attempts,
        lambda: CommitGaveUp(
            f"batch {batch.number} of {pipeline!r}: the commit to {table.identifier} did not settle after "
            f"{request.max_attempts} attempts. Nothing was duplicated; run again."
        ),
        f"the commit of batch {batch.number} to {table.identifier}",
    )
