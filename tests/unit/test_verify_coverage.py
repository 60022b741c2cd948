"""``ingest verify``'s expectations under any sequence of batches and resets: for each offset it
checks, it expects the rows to hold it as many times as the ledger's history read it.

Batches and resets are committed by the real code (:func:`ingest.committer.commit_rows`,
:func:`ingest.ops.reset.reset`) to in-memory tables; what verify expects is computed by the real
:func:`ingest.core.coverage.coverage` from those tables, and compared with a count kept here of which
offsets each batch read."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Literal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.committer import RowsCommit, commit_rows, observe
from ingest.config import parse
from ingest.core.coverage import coverage
from ingest.core.ledger import BatchCounts, TopicPartition
from ingest.core.ledger_codec import decode, encode
from ingest.core.plan import KafkaView, PlanPolicy, Watermarks, plan_batch
from ingest.ops.reset import reset
from ingest.ops.reset_command import ResetTarget
from ingest.ops.verify_reads import expected_reads
from ingest.testing.memory_table import MemoryCatalog

TOPIC = "orders"
PARTITIONS = [TopicPartition(TOPIC, p) for p in range(2)]
CONFIG = parse(
    {
        "pipeline": "orders",
        "kafka": {"bootstrap.servers": "unused:9092"},
        "topics": [TOPIC],
        "catalog": {"name": "memory"},
        "table": "lake.orders",
        "schema": [{"name": "id", "type": "long"}],
    },
    "memory.yaml",
)

Step = Literal["produce", "batch", "reset", "earliest", "latest"]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 1), st.integers(1, 12)),
        st.tuples(st.just("batch"), st.integers(1, 9), st.just(0)),
        st.tuples(st.just("reset"), st.integers(0, 1), st.integers(0, 40)),  # to an offset of one partition
        st.tuples(st.just("earliest"), st.just(0), st.just(0)),
        st.tuples(st.just("latest"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


class Source:
    def __init__(self) -> None:
        self.high = dict.fromkeys(PARTITIONS, 0)

    def describe(self) -> KafkaView:
        return KafkaView("cluster-A", {tp: Watermarks(0, high) for tp, high in self.high.items()})


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_verify_expects_each_offset_as_many_times_as_the_ledger_read_it(steps: list[tuple[Step, int, int]]) -> None:
    rows, dead = MemoryCatalog("lake.orders"), MemoryCatalog("lake.orders_dead_letter")
    source = Source()
    pipeline: Any = SimpleNamespace(config=CONFIG, rows=rows.table(), dead=dead.table(), source=source)
    read: Counter[tuple[TopicPartition, int]] = Counter()
    for number, (step, a, b) in enumerate(steps):
        pipeline.rows.refresh()
        if step == "produce":
            source.high[PARTITIONS[a]] += b
        elif step == "batch":
            found = observe(pipeline.rows, CONFIG.pipeline)
            batch = plan_batch(found.ledger if found else None, source.describe(), PlanPolicy("earliest", "fail", a))
            if not batch.moves_ledger:
                continue
            for tp, start, end in batch.ranges():
                read.update((tp, o) for o in range(start, end))
            request = RowsCommit(CONFIG.pipeline, batch, batch.ledger(), [], BatchCounts(records=0), 3)
            commit_rows(pipeline.rows, request)
        else:
            tp = PARTITIONS[a]
            target = ResetTarget(step) if step != "reset" else ResetTarget("offsets", {tp: min(b, source.high[tp])})
            reset(pipeline, target, f"step {number}")

    pipeline.rows.refresh()
    found = observe(pipeline.rows, CONFIG.pipeline)
    if found is None:
        return
    claims = coverage(CONFIG.pipeline, pipeline.rows.ancestry())
    for tp, end in found.ledger.offsets.items():
        # above the ledger's end too: what a backward reset left to be read again
        start, top = claims.lowest(tp, end), claims.top(tp, end)
        offsets = pa.array(range(start, top + 5), pa.int64())
        expected = expected_reads(offsets, claims, tp, end).to_pylist() if len(offsets) else []
        assert expected == [read[(tp, o)] for o in range(start, top + 5)], (tp, start, end, claims)


@pytest.mark.parametrize("origin_kept", [True, False], ids=["origin-kept", "written-before-origins"])
def test_after_expiry_the_resets_ledgers_remember_still_count(origin_kept: bool) -> None:
    """Read [0,20), reset back to 5, read [5,30); then expiry keeps only the newest ledger: offsets
    5..19 are still expected twice (the newest ledger remembers the reset's move), and the check
    starts where reading began (the newest ledger carries it), or, with a ledger written before
    origins were kept, at the oldest ledger's start."""
    rows, dead = MemoryCatalog("lake.orders"), MemoryCatalog("lake.orders_dead_letter")
    source = Source()
    pipeline: Any = SimpleNamespace(config=CONFIG, rows=rows.table(), dead=dead.table(), source=source)
    tp = PARTITIONS[0]

    def batch(n: int) -> None:
        pipeline.rows.refresh()
        found = observe(pipeline.rows, CONFIG.pipeline)
        planned = plan_batch(found.ledger if found else None, source.describe(), PlanPolicy("earliest", "fail", n))
        commit_rows(pipeline.rows, RowsCommit(CONFIG.pipeline, planned, planned.ledger(), [], BatchCounts(), 3))

    source.high[tp] = 20
    batch(10)
    batch(10)
    pipeline.rows.refresh()
    reset(pipeline, ResetTarget("offsets", {tp: 5}), "back")
    batch(15)
    source.high[tp] = 30
    batch(10)
    pipeline.rows.refresh()
    newest = next(iter(pipeline.rows.ancestry()))
    if not origin_kept:  # a ledger written before origins were kept
        ledger = decode(CONFIG.pipeline, newest.summary)
        assert ledger is not None and ledger.origin
        summary = {**newest.summary, **encode(CONFIG.pipeline, replace(ledger, origin={}), BatchCounts())}
        newest = replace(newest, summary=summary)

    claims = coverage(CONFIG.pipeline, [newest])  # what expiry leaves

    assert (claims.complete, claims.lowest(tp, 30)) == ((True, 0) if origin_kept else (False, 20))
    assert expected_reads(pa.array(range(5, 30), pa.int64()), claims, tp, 30).to_pylist() == [2] * 15 + [1] * 10
