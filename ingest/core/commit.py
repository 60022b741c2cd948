"""The commit decision: compare-and-swap on the ledger.

Before every commit attempt the adapter re-reads the branch head's ledger (``observed``) and asks
:func:`decide` what to do. A conflict or an unknown outcome (timeout, 5xx, a lost acknowledgement)
is never retried blindly: the next observation settles it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ingest.core.ledger import Ledger, TopicPartition
from ingest.core.plan import Batch


class Decision(Enum):
    #: the head still carries the ledger this batch was planned from: commit, requiring that head
    COMMIT = "commit"
    #: the head carries exactly this batch's end ledger, committed the same way (by a batch, or by
    #: the same reset): an earlier attempt (or an identical concurrent copy) landed and its
    #: acknowledgement was lost; nothing to do
    LANDED = "landed"
    #: another writer advanced the ledger elsewhere: this batch's files are orphans; plan again
    FENCED = "fenced"


def _same(a: Ledger | None, batch_number: int | None, offsets: Mapping[TopicPartition, int] | None) -> bool:
    if a is None or offsets is None:
        return a is None and offsets is None
    return a.batch == batch_number and dict(a.offsets) == dict(offsets)


def _marker(ledger: Ledger | None) -> str | None:
    """The id of the dead-letter marker ``ledger`` carries (None: none)."""
    return ledger.sync.sync_id if ledger is not None and ledger.sync is not None else None


def decide(observed: Ledger | None, batch: Batch) -> Decision:
    # COMMIT also requires the head's marker to be the base's: the batch settled that one before it
    # staged its dead letters. A rollback (or a publish) that lands main on the same ledger with a
    # new marker owes the dead-letter table a step the batch's staging did not see: FENCED, so the
    # batch plans again from it and settles it first.
    base_number = batch.base.batch if batch.base is not None else None
    base_offsets = batch.base.offsets if batch.base is not None else None
    if _same(observed, base_number, base_offsets) and _marker(observed) == _marker(batch.base):
        return Decision.COMMIT
    if _same(observed, batch.number, batch.end) and observed is not None and observed.reset_id == batch.reset_id:
        return Decision.LANDED
    # a reset that moved the ledger to exactly this batch's end carries none of its records
    return Decision.FENCED


@dataclass(frozen=True)
class DeadLetterStep:
    """How a batch's dead letters go into the dead-letter table, given that table's own ledger.

    The dead-letter ledger ``floor`` means: no dead letter lies at or above ``floor[tp]``. A batch
    adds its dead letters at or above the floor as they are (:meth:`keeps`) and moves the floor to
    ``max(floor, end)``; those below it (a re-run after a crash between the two table commits, an
    identical concurrent copy, a re-read after a backward reset, or a range a forward reset skipped
    and a backward one reads now) are looked up in the table (:meth:`looks_up`), so none is added
    twice and none is dropped, whatever decoding wrote the ones there.
    """

    floor: Mapping[TopicPartition, int]
    new_floor: Mapping[TopicPartition, int]

    def keeps(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the dead letter of ``offset`` is added without a look (it cannot be in the table)."""
        return offset >= self.floor.get(tp, -1)

    def looks_up(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the dead letter of ``offset`` must be looked up in the table (it may be there or not)."""
        return not self.keeps(tp, offset)

    @property
    def moves(self) -> bool:
        return dict(self.new_floor) != dict(self.floor)


def dead_letter_step(floor: Ledger | None, batch: Batch) -> DeadLetterStep:
    current = dict(floor.offsets) if floor is not None else {}
    new_floor = dict(current)
    for tp, end in batch.end.items():
        new_floor[tp] = max(current.get(tp, end), end)
    return DeadLetterStep(floor=current, new_floor=new_floor)
