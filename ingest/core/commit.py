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


def decide(observed: Ledger | None, batch: Batch) -> Decision:
    base_number = batch.base.batch if batch.base is not None else None
    base_offsets = batch.base.offsets if batch.base is not None else None
    if _same(observed, base_number, base_offsets):
        return Decision.COMMIT
    if _same(observed, batch.number, batch.end) and observed is not None and observed.reset_id == batch.reset_id:
        return Decision.LANDED
    # a reset that moved the ledger to exactly this batch's end carries none of its records
    return Decision.FENCED


@dataclass(frozen=True)
class DeadLetterStep:
    """How a batch's dead letters go into the dead-letter table, given that table's own ledger.

    The dead-letter ledger says, per partition, which offsets' dead letters the table holds
    completely: ``[low, floor)``, ``low`` being its start offsets and ``floor`` its offsets. No
    dead letter lies at or above the floor. So a batch adds its dead letters at or above the floor
    as they are, drops those in ``[low, floor)`` (they are in already: a re-run after a crash
    between the two table commits, an identical concurrent copy, a re-read after a backward reset),
    and looks up those below ``low`` in the table (:meth:`looks_up`): what a forward reset skipped
    was never dead-lettered, and a backward reset may read it now. The range grows by the batch's
    ``[start, end)`` when it touches it; a batch that starts past the floor (after a forward reset)
    starts the range anew, and what lies below is looked up from then on. A dead-letter ledger
    written before ranges were kept starts them at its last batch's start.
    """

    floor: Mapping[TopicPartition, int]
    new_floor: Mapping[TopicPartition, int]
    low: Mapping[TopicPartition, int]
    new_low: Mapping[TopicPartition, int]

    def keeps(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the dead letter of ``offset`` is added without a look (it cannot be in the table)."""
        return tp not in self.floor or offset >= self.floor[tp]

    def looks_up(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the dead letter of ``offset`` must be looked up in the table (it may be there or not)."""
        return tp in self.floor and offset < self.low[tp]

    @property
    def moves(self) -> bool:
        return dict(self.new_floor) != dict(self.floor) or dict(self.new_low) != dict(self.low)


def dead_letter_step(floor: Ledger | None, batch: Batch) -> DeadLetterStep:
    high = dict(floor.offsets) if floor is not None else {}
    # a ledger whose start offsets lack a partition knows of none of it below its floor
    low = {tp: min(floor.start_offsets.get(tp, end), end) for tp, end in high.items()} if floor else {}
    new_high, new_low = dict(high), dict(low)
    for tp, end in batch.end.items():
        start = min(batch.start.get(tp, end), end)
        if tp not in high or start > high[tp]:  # new, or past a gap: the range starts anew
            new_low[tp], new_high[tp] = start, end
        elif end >= low[tp]:  # it touches the range: one range again
            new_low[tp], new_high[tp] = min(low[tp], start), max(high[tp], end)
        # (wholly below the range: its dead letters were looked up; the range stays)
    return DeadLetterStep(floor=high, new_floor=new_high, low=low, new_low=new_low)
