"""Tests' shorthand for running an open pipeline on a local engine of its own (closed after)."""

from __future__ import annotations

from typing import Any

from ingest.assembly import Opened
from ingest.batch_result import BatchResult
from ingest.ops.replay import replay
from ingest.runner import engine_for


def one_batch(pipeline: Opened) -> BatchResult:
    """Plan and commit one batch of ``pipeline`` on a local engine."""
    with engine_for(pipeline) as run:
        return run.batch()


def catch_up(pipeline: Opened, max_batches: int | None = None) -> list[BatchResult]:
    """Batches of ``pipeline`` until it reaches the end offsets Kafka showed at start."""
    with engine_for(pipeline) as run:
        return list(run.batches(until_caught_up=True, max_batches=max_batches))


def replay_on(pipeline: Opened, **options: Any) -> dict[str, Any]:
    """``ingest replay`` of ``pipeline`` (its catch-ups on one local engine)."""
    with engine_for(pipeline) as run:
        return replay(run, **options)
