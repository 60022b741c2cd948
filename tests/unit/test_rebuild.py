"""Rebuilding a lost ledger from the tables' Kafka coordinates (ingest.core.rebuild)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.core.commit import dead_letter_step
from ingest.core.ledger import Ledger, TopicPartition
from ingest.core.plan import Batch, KafkaView, Watermarks
from ingest.core.rebuild import rebuild_floor, rebuild_offsets
from ingest.errors import TopicRecreated

P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)
P2 = TopicPartition("orders", 2)


def kafka(**partitions: tuple[int, int]) -> KafkaView:
    names = {"p0": P0, "p1": P1, "p2": P2}
    return KafkaView("c", {names[k]: Watermarks(low, high) for k, (low, high) in partitions.items()})


def test_resumes_one_past_the_newest_row_and_unseen_partitions_at_their_low_watermark() -> None:
    rebuilt = rebuild_offsets({P0: 99, P1: 7}, {P0: 98}, kafka(p0=(0, 120), p1=(5, 8), p2=(30, 40)))

    assert rebuilt.offsets == {P0: 100, P1: 8, P2: 30}
    assert rebuilt.unseen == (P2,)


def test_dead_letters_after_the_newest_row_are_read_again_not_skipped() -> None:
    # they may be a batch whose rows never landed: its good records are in neither table
    rebuilt = rebuild_offsets({P0: 40}, {P0: 55, P1: 3}, kafka(p0=(0, 60), p1=(0, 4)))

    assert rebuilt.offsets == {P0: 41, P1: 0}
    assert rebuilt.unseen == (P1,)  # only dead letters there: no row to resume after


@pytest.mark.parametrize(
    ("rows", "dead"),
    [({P0: 120}, {}), ({}, {P0: 130}), ({P1: 0}, {})],
    ids=["row-beyond-the-end", "dead-letter-beyond-the-end", "partition-kafka-lacks"],
)
def test_offsets_kafka_does_not_hold_mean_a_recreated_topic(
    rows: dict[TopicPartition, int], dead: dict[TopicPartition, int]
) -> None:
    with pytest.raises(TopicRecreated) as caught:
        rebuild_offsets(rows, dead, kafka(p0=(0, 120)))
    assert "recreated" in str(caught.value) and "--to-offsets" in str(caught.value)


def test_floor_is_the_ledger_or_past_the_newest_dead_letter_whichever_is_higher() -> None:
    assert rebuild_floor({P0: 100, P1: 8, P2: 30}, {P0: 98, P1: 12}) == {P0: 100, P1: 13, P2: 30}


# --- the property: resuming from the rebuilt ledger lands every record exactly once -------------

KINDS = st.lists(st.sampled_from(["good", "bad", "marker"]), min_size=1, max_size=40)


@given(
    kinds=KINDS,
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=6),
    crash=st.booleans(),
    floor_lost=st.booleans(),
)
def test_resuming_from_a_rebuilt_ledger_lands_every_record_exactly_once(
    kinds: list[str], cuts: list[int], crash: bool, floor_lost: bool
) -> None:
    """One partition ingested in batches (dead letters first, then rows, the last rows commit maybe
    lost to a crash), both ledgers then lost; rebuild, resume to the end, count every offset."""
    end = len(kinds)
    ends = sorted({min(c, end) for c in cuts} | {end})
    rows: Counter[int] = Counter()
    dead: Counter[int] = Counter()
    floor: Ledger | None = None
    ledger = 0
    for i, batch_end in enumerate(ends):
        batch = Batch(number=i + 1, base=None, start={P0: ledger}, end={P0: batch_end}, cluster_id="c")
        step = dead_letter_step(floor, batch)
        bad = [o for o in range(ledger, batch_end) if kinds[o] == "bad"]
        if bad:
            dead.update(o for o in bad if step.keeps(P0, o))
            floor = Ledger(batch=i + 1, offsets=step.new_floor)
        if crash and i == len(ends) - 1:
            break  # the dead letters landed, the rows commit did not
        rows.update(o for o in range(ledger, batch_end) if kinds[o] == "good")
        ledger = batch_end

    rebuilt = rebuild_offsets(
        {P0: max(rows)} if rows else {}, {P0: max(dead)} if dead else {}, kafka(p0=(0, end))
    ).offsets
    if floor_lost and dead:
        floor = Ledger(batch=1, offsets=rebuild_floor(rebuilt, {P0: max(dead)}))
    resumed = Batch(number=1, base=None, start=rebuilt, end={P0: end}, cluster_id="c")
    step = dead_letter_step(floor, resumed)
    for o in range(rebuilt[P0], end):
        if kinds[o] == "good":
            rows[o] += 1
        elif kinds[o] == "bad" and step.keeps(P0, o):
            dead[o] += 1

    assert rows == Counter(o for o, k in enumerate(kinds) if k == "good")
    assert dead == Counter(o for o, k in enumerate(kinds) if k == "bad")
