"""The dead-letter guardrail: a batch's share of dead letters, alone and over the last batches."""

from __future__ import annotations

from ingest.core.ledger import BatchCounts
from ingest.core.poison import too_many


def counts(good: int, dead: int) -> BatchCounts:
    return BatchCounts(records=good, dead_letters=dead)


def test_a_batch_over_the_ratio_is_stopped_and_one_under_it_is_not() -> None:
    assert too_many(0.1, 10, 100, counts(0, 300), []) == "300 of its 300 records (100.0%) are dead letters"
    assert too_many(0.1, 10, 100, counts(950, 50), []) is None
    assert too_many(None, 10, 100, counts(0, 300), []) is None  # no limit set
    assert too_many(0.0, 10, 1, counts(10, 0), []) is None  # no dead letters: nothing to judge


def test_small_batches_are_judged_together_over_the_window() -> None:
    small = counts(6, 2)  # 25% of 8 records: too few to judge alone
    assert too_many(0.2, 3, 10, small, []) is None
    assert too_many(0.2, 3, 10, small, [counts(6, 2)]) == (
        "4 of the 16 records of the last 2 batches (25.0%) are dead letters"
    )
    assert too_many(0.2, 3, 10, small, [counts(100, 0), counts(100, 0)]) is None  # diluted by good batches
    assert too_many(0.2, 2, 10, small, [counts(6, 2), counts(0, 50)]) is not None  # only the window counts
    assert too_many(0.2, 2, 10, counts(8, 0), [counts(0, 50)]) is None  # this batch has none


def test_a_batch_under_the_ratio_passes_after_one_that_was_let_through() -> None:
    """The operator raised the ratio to let a bad batch through, then lowered it: the steady low
    rate of poison after it does not stop every batch while the bad one is in the window."""
    let_through = counts(0, 300)
    assert too_many(0.05, 10, 100, counts(990, 10), [let_through]) is None
    assert too_many(0.05, 10, 100, counts(8, 1), [let_through]) is not None  # a small one over it: a trend
