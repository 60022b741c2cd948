"""How many times a pipeline's ledger history read each offset of a partition (``ingest verify``):
once if the ledger crossed it going up from where the partition began, once more per backward
reset over it, once less per forward reset or skipped loss over it (:mod:`ingest.core.coverage`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.coverage import Coverage
from ingest.core.ledger import TopicPartition
from ingest.core.ranges import Range


def _within(values: pa.Array, spans: list[Range], tp: TopicPartition) -> pa.Array:
    """How many of ``spans`` (of partition ``tp``) contain each value."""
    hits = pa.array([0] * len(values), pa.int64())
    for span_tp, lo, hi in spans:
        if span_tp == tp:
            inside = pc.and_(pc.greater_equal(values, lo), pc.less(values, hi))
            hits = pc.add(hits, pc.cast(inside, pa.int64()))
    return hits


def expected_reads(values: pa.Array, claims: Coverage, tp: TopicPartition, end: int) -> pa.Array:
    """How many times the ledger's moves read each offset of ``values``, ``end`` being where the
    ledger is now. Each read moved the ledger up over the offset once, so it was read as many
    times as the ledger crossed it upwards in batches: once if the ledger went from below it
    (where the partition began) to above it (``end``), plus once per backward move over it (a
    reset that re-reads), less once per forward move over it (a reset that skips, a loss skipped).
    Counting crossings so gives the net effect of any sequence of resets, in whatever order, also
    above ``end`` (what a backward reset left to be read again) and below where the partition began."""
    began = pc.cast(pc.less(values, end), pa.int64())
    if claims.complete:
        began = pc.subtract(began, pc.cast(pc.less(values, claims.origin.get(tp, 0)), pa.int64()))
    # (where reading began expired: every offset below the ledger is taken as read once before the resets)
    return pc.subtract(pc.add(_within(values, claims.reread, tp), began), _within(values, claims.excluded, tp))
