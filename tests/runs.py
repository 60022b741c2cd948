"""Tests' shorthand for running an open pipeline on a local engine of its own (closed after), and
for the ledger it committed."""

from __future__ import annotations

from typing import Any

from ingest.assembly import Opened
from ingest.batch_result import BatchResult
from ingest.core.ledger import Found
from ingest.ops.replay import replay
from ingest.ops.replay_result import ReplayResult
from ingest.runner import engine_for


def head_ledger(pipeline: Opened) -> Found:
    """The ledger the rows table's branch head carries, and its snapshot (the test committed one)."""
    found = pipeline.ledger()
    assert found is not None, f"{pipeline.config.pipeline}: no ledger on the branch"
    return found


def one_batch(pipeline: Opened) -> BatchResult:
    """Plan and commit one batch of ``pipeline`` on a local engine."""
    with engine_for(pipeline) as run:
        return run.batch()


def catch_up(pipeline: Opened, max_batches: int | None = None) -> list[BatchResult]:
    """Batches of ``pipeline`` until it reaches the end offsets Kafka showed at start."""
    with engine_for(pipeline) as run:
        return list(run.batches(until_caught_up=True, max_batches=max_batches))


def replay_on(pipeline: Opened, **options: Any) -> ReplayResult:
    """``ingest replay`` of ``pipeline`` (its catch-ups on one local engine)."""
    with engine_for(pipeline) as run:
        return replay(run, **options)
