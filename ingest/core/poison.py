"""The dead-letter guardrail (``dead_letters.max_ratio``): whether a batch's poison records are too
many to commit as if all were well. Pure: the counts come from the batch and the ledger history."""

from __future__ import annotations

from collections.abc import Sequence

from ingest.core.ledger import BatchCounts


def too_many(
    max_ratio: float | None, window: int, min_records: int, this: BatchCounts, before: Sequence[BatchCounts]
) -> str | None:
    """Why the dead letters of batch ``this`` are too many; None if they are not. A batch over
    ``max_ratio`` is stopped if it has ``min_records`` or more; a smaller one over it, if the last
    ``window`` batches with it (``before``: those committed before it, newest first) are over it
    together, with ``min_records`` or more. A batch under the ratio always passes."""
    total = this.records + this.dead_letters
    if max_ratio is None or this.dead_letters <= max_ratio * total:
        return (
            None  # a batch under the ratio passes, whatever came before (a batch let through once stays in the window)
        )
    if total >= min_records:
        return f"{this.dead_letters} of its {total} records ({this.dead_letters / total:.1%}) are dead letters"
    recent = [this, *before[: window - 1]]  # a small batch over the ratio: is it a trend?
    dead = sum(c.dead_letters for c in recent)
    seen = dead + sum(c.records for c in recent)
    if len(recent) > 1 and seen >= min_records and dead > max_ratio * seen:
        return f"{dead} of the {seen} records of the last {len(recent)} batches ({dead / seen:.1%}) are dead letters"
    return None
