"""Batch planning (ingest.core.plan): fair caps, start positions, loss and recreation checks."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.core.ledger import Ledger, LostRange, TopicPartition
from ingest.core.plan import Batch, KafkaView, PlanPolicy, StartPosition, Watermarks, fair_caps, plan_batch
from ingest.errors import DataLoss, ExitCode, FatalError, TopicIdChanged, TopicRecreated

P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)
P2 = TopicPartition("orders", 2)
Q0 = TopicPartition("payments", 0)
CLUSTER = "cluster-A"


def view(cluster: str | None = CLUSTER, **partitions: tuple[int, int]) -> KafkaView:
    """``view(p0=(low, high), q0=(low, high))``."""
    names = {"p0": P0, "p1": P1, "p2": P2, "q0": Q0}
    return KafkaView(cluster, {names[k]: Watermarks(low, high) for k, (low, high) in partitions.items()})


def ledger(batch: int = 1, cluster: str | None = CLUSTER, **offsets: int) -> Ledger:
    names = {"p0": P0, "p1": P1, "p2": P2, "q0": Q0}
    return Ledger(batch=batch, offsets={names[k]: v for k, v in offsets.items()}, cluster_id=cluster)


# --- fair_caps ---------------------------------------------------------------------------------


def test_fair_caps_gives_everything_when_under_the_limit() -> None:
    assert fair_caps({P0: 3, P1: 0, P2: 5}, 100) == {P0: 3, P1: 0, P2: 5}


def test_fair_caps_splits_evenly_with_remainder_to_the_first_partitions_in_order() -> None:
    assert fair_caps({P2: 10, P0: 10, P1: 10}, 10) == {P0: 4, P1: 3, P2: 3}


def test_fair_caps_small_partitions_leave_their_share_to_the_others() -> None:
    assert fair_caps({P0: 1, P1: 100, P2: 2}, 12) == {P0: 1, P1: 9, P2: 2}


def test_fair_caps_a_busy_partition_does_not_starve_the_others() -> None:
    caps = fair_caps({P0: 1_000_000, P1: 50, P2: 50}, 90)

    assert caps == {P0: 30, P1: 30, P2: 30}


def test_fair_caps_with_fewer_records_than_partitions() -> None:
    assert fair_caps({P0: 5, P1: 5, P2: 5}, 2) == {P0: 1, P1: 1, P2: 0}


def test_fair_caps_of_nothing_available() -> None:
    assert fair_caps({}, 10) == {}
    assert fair_caps({P0: 0, P1: 0}, 10) == {P0: 0, P1: 0}


availability = st.dictionaries(
    st.builds(TopicPartition, st.sampled_from(["a", "b"]), st.integers(0, 9)), st.integers(0, 10_000), max_size=12
)


@given(available=availability, limit=st.integers(1, 50_000))
def test_fair_caps_invariants(available: dict[TopicPartition, int], limit: int) -> None:
    caps = fair_caps(available, limit)

    assert set(caps) == set(available)
    assert all(0 <= caps[tp] <= available[tp] for tp in available)
    # never over the limit, and the whole limit is used when enough is available
    assert sum(caps.values()) == min(limit, sum(available.values()))
    # water-filling (max-min fairness): a partition that did not get all it had is at the water
    # level, so no other partition got more than one record above it
    top = max(caps.values(), default=0)
    for tp in available:
        if caps[tp] < available[tp]:
            assert caps[tp] >= top - 1


@given(available=availability, limit=st.integers(1, 50_000), seed=st.integers(0, 2**32))
def test_fair_caps_is_deterministic_whatever_the_mapping_order(
    available: dict[TopicPartition, int], limit: int, seed: int
) -> None:
    items = list(available.items())
    random.Random(seed).shuffle(items)

    assert fair_caps(dict(items), limit) == fair_caps(available, limit)


# --- plan_batch: start positions ---------------------------------------------------------------


def test_first_batch_from_earliest_starts_at_the_low_watermark() -> None:
    batch = plan_batch(None, view(p0=(5, 20), p1=(0, 3)), PlanPolicy(start="earliest"))

    assert batch.number == 1
    assert batch.base is None
    assert batch.start == {P0: 5, P1: 0}
    assert batch.end == {P0: 20, P1: 3}
    assert batch.cluster_id == CLUSTER
    assert batch.ranges() == [(P0, 5, 20), (P1, 0, 3)]
    assert batch.planned_records == 18


def test_first_batch_from_latest_reads_nothing_but_pins_the_position() -> None:
    batch = plan_batch(None, view(p0=(5, 20), p1=(0, 3)), PlanPolicy(start="latest"))

    assert batch.start == {P0: 20, P1: 3}
    assert batch.end == {P0: 20, P1: 3}
    assert batch.ranges() == []
    assert batch.moves_ledger  # the first commit records where "latest" was


def test_first_batch_from_a_timestamp_starts_at_the_offsets_kafka_gave_for_it() -> None:
    # p0: records from offset 12 on are that recent; p1: none is (Kafka answers the end offset);
    # p2: the offset found was since deleted by retention
    found = {P0: 12, P1: 3, P2: 1}
    batch = plan_batch(
        None, view(p0=(5, 20), p1=(0, 3), p2=(4, 6)), PlanPolicy(start=1_764_547_200_000), from_time=found
    )

    assert batch.start == {P0: 12, P1: 3, P2: 4}
    assert batch.ranges() == [(P0, 12, 20), (P2, 4, 6)]


def test_a_timestamp_start_matters_only_for_the_first_batch() -> None:
    policy = PlanPolicy(start=1_764_547_200_000)
    with pytest.raises(ValueError, match="needs the offsets for that time"):
        plan_batch(None, view(p0=(0, 20)), policy)

    batch = plan_batch(ledger(p0=10), view(p0=(0, 20), p1=(2, 9)), policy)  # no lookup once committed

    assert batch.start == {P0: 10, P1: 2}  # and a partition added later starts at earliest


def test_resumes_at_the_ledger() -> None:
    batch = plan_batch(ledger(p0=12, p1=3), view(p0=(0, 20), p1=(0, 3)), PlanPolicy())

    assert batch.start == {P0: 12, P1: 3}
    assert batch.end == {P0: 20, P1: 3}
    assert batch.ranges() == [(P0, 12, 20)]


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_a_partition_added_later_starts_at_earliest_even_when_start_is_latest(start: StartPosition) -> None:
    batch = plan_batch(ledger(p0=10), view(p0=(0, 10), p1=(4, 9)), PlanPolicy(start=start))

    assert batch.start == {P0: 10, P1: 4}
    assert batch.end == {P0: 10, P1: 9}


def test_a_topic_added_later_starts_at_earliest() -> None:
    batch = plan_batch(ledger(p0=10), view(p0=(0, 10), q0=(0, 2)), PlanPolicy(start="latest"))

    assert batch.start[Q0] == 0 and batch.end[Q0] == 2


# --- plan_batch: caps --------------------------------------------------------------------------


def test_the_record_cap_is_shared_across_partitions() -> None:
    batch = plan_batch(
        ledger(p0=0, p1=90, p2=0), view(p0=(0, 1000), p1=(0, 100), p2=(0, 1)), PlanPolicy(max_records=21)
    )

    assert batch.end == {P0: 10, P1: 100, P2: 1}
    assert batch.planned_records == 21


hw = st.integers(0, 200)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Ledger | None, KafkaView, PlanPolicy]:
    """A ledger (or none) and a Kafka view that is consistent with it (no loss, no recreation)."""
    tps = draw(st.lists(st.sampled_from([P0, P1, P2, Q0]), min_size=1, max_size=4, unique=True))
    marks = {}
    for tp in tps:
        low = draw(st.integers(0, 50))
        marks[tp] = Watermarks(low, low + draw(hw))
    known = draw(st.lists(st.sampled_from(tps), unique=True)) if draw(st.booleans()) else None
    base = None
    if known is not None:
        offsets = {tp: draw(st.integers(marks[tp].low, marks[tp].high)) for tp in known}
        base = Ledger(batch=draw(st.integers(1, 1000)), offsets=offsets, cluster_id=CLUSTER)
    policy = PlanPolicy(start=draw(st.sampled_from(["earliest", "latest"])), max_records=draw(st.integers(1, 300)))
    return base, KafkaView(CLUSTER, marks), policy


@given(scenarios())
def test_plan_ranges_stay_within_the_ledger_and_the_readable_end(
    scenario: tuple[Ledger | None, KafkaView, PlanPolicy],
) -> None:
    base, kafka, policy = scenario
    batch = plan_batch(base, kafka, policy)

    assert set(batch.start) == set(batch.end) == set(kafka.partitions)
    for tp, wm in kafka.partitions.items():
        assert wm.low <= batch.start[tp] <= batch.end[tp] <= wm.high
        if base is not None and tp in base.offsets:
            assert batch.start[tp] == base.offsets[tp]
    assert batch.planned_records <= policy.max_records
    available = sum(wm.high - batch.start[tp] for tp, wm in kafka.partitions.items())
    assert batch.planned_records == min(policy.max_records, available)
    assert batch.number == (base.batch + 1 if base else 1)
    assert batch.lost == ()


# --- plan_batch: data loss ---------------------------------------------------------------------


def test_retention_loss_fails_by_default() -> None:
    with pytest.raises(DataLoss) as caught:
        plan_batch(ledger(p0=10, p1=0), view(p0=(25, 40), p1=(0, 0)), PlanPolicy())

    error = caught.value
    assert isinstance(error, FatalError) and not error.retryable
    assert (error.topic, error.partition, error.start, error.low) == ("orders", 0, 10, 25)
    assert "[10, 25)" in str(error)
    assert "on_data_loss: skip" in str(error)


def test_retention_loss_with_skip_records_the_lost_range_and_starts_at_low() -> None:
    batch = plan_batch(ledger(p0=10, p1=0), view(p0=(25, 40), p1=(0, 0)), PlanPolicy(on_data_loss="skip"))

    assert batch.lost == (LostRange(P0, 10, 25),)
    assert batch.start == {P0: 25, P1: 0}
    assert batch.end == {P0: 40, P1: 0}


def test_a_skipped_loss_moves_the_ledger_even_without_new_data() -> None:
    batch = plan_batch(ledger(p0=10), view(p0=(25, 25)), PlanPolicy(on_data_loss="skip"))

    assert batch.ranges() == []
    assert batch.end == {P0: 25}
    assert batch.moves_ledger


def test_starting_exactly_at_the_low_watermark_is_not_a_loss() -> None:
    batch = plan_batch(ledger(p0=25), view(p0=(25, 30)), PlanPolicy())

    assert batch.lost == () and batch.start == {P0: 25}


# --- plan_batch: recreated topics and clusters ------------------------------------------------


def test_ledger_beyond_the_end_of_the_partition_means_the_topic_was_recreated() -> None:
    with pytest.raises(TopicRecreated, match=r"orders\[0\].*offset 50.*ends at 7"):
        plan_batch(ledger(p0=50), view(p0=(0, 7)), PlanPolicy(on_data_loss="skip"))


def test_ledger_at_the_end_of_the_partition_is_fine() -> None:
    batch = plan_batch(ledger(p0=7), view(p0=(0, 7)), PlanPolicy())

    assert batch.ranges() == []


def test_a_partition_that_disappeared_means_the_topic_was_recreated() -> None:
    with pytest.raises(TopicRecreated, match=r"orders\[1\]"):
        plan_batch(ledger(p0=3, p1=3), view(p0=(0, 10)), PlanPolicy())


def test_a_changed_cluster_id_means_the_cluster_was_recreated() -> None:
    with pytest.raises(TopicRecreated, match=r"cluster-A.*cluster-B"):
        plan_batch(ledger(p0=3), view(cluster="cluster-B", p0=(0, 10)), PlanPolicy())


OLD_ID, NEW_ID, PAYMENTS_ID = "GCRqv5ExRvmLGBc9uuOoNQ", "uNtjX0cYT6K1pW3v_9Bfsw", "Zm9vYmFyYmF6cXV4MTIzNA"


def ids_in(base: Ledger, **ids: str) -> Ledger:
    return dataclasses.replace(base, topic_ids=ids)


def ids_of(now: KafkaView, **ids: str) -> KafkaView:
    return dataclasses.replace(now, topic_ids=ids)


def test_a_topic_with_another_id_was_recreated_even_when_it_holds_more_than_the_ledger_read() -> None:
    # the new topic holds 450 records, the ledger read 300 of the old one: the offsets alone look fine
    old = ids_in(ledger(p0=150, p1=150, q0=7), orders=OLD_ID, payments=PAYMENTS_ID)
    now = ids_of(view(p0=(0, 225), p1=(0, 225), q0=(0, 9)), orders=NEW_ID, payments=PAYMENTS_ID)

    with pytest.raises(TopicIdChanged) as caught:
        plan_batch(old, now, PlanPolicy())

    error = caught.value
    assert error.exit_code == ExitCode.FATAL and isinstance(error, TopicRecreated)
    assert error.changed == (("orders", OLD_ID, NEW_ID),)
    message = str(error)
    assert "topic 'orders' was deleted and recreated" in message
    assert f"the ledger has {OLD_ID}, Kafka has {NEW_ID}" in message
    assert 'ingest reset -c <config> --to-offsets orders:0=0,orders:1=0 --reason "recreated orders"' in message
    assert "--table" not in message
    assert "--table analytics.orders --to-offsets" in str(error.on_table("analytics.orders"))


def test_the_reset_a_recreated_topic_names_starts_at_its_earliest_retained_offsets() -> None:
    old = ids_in(ledger(p0=150, p1=150), orders=OLD_ID)
    now = ids_of(view(p0=(40, 225), p1=(0, 225)), orders=NEW_ID)

    with pytest.raises(TopicIdChanged, match="--to-offsets orders:0=40,orders:1=0 "):
        plan_batch(old, now, PlanPolicy())


def test_the_same_topic_id_plans_as_usual_and_the_ledger_keeps_the_ids() -> None:
    old = ids_in(ledger(p0=150, q0=7), orders=OLD_ID, payments=PAYMENTS_ID)
    now = ids_of(view(p0=(0, 225), q0=(0, 9)), orders=OLD_ID, payments=PAYMENTS_ID)

    batch = plan_batch(old, now, PlanPolicy())

    assert batch.ranges() == [(P0, 150, 225), (Q0, 7, 9)]
    assert batch.ledger().topic_ids == {"orders": OLD_ID, "payments": PAYMENTS_ID}


def test_a_topic_no_longer_read_keeps_its_id_and_a_new_one_records_its_own() -> None:
    old = ids_in(ledger(q0=7), payments=PAYMENTS_ID)
    now = ids_of(view(p0=(0, 5)), orders=NEW_ID)  # payments no longer configured (or deleted)

    batch = plan_batch(old, now, PlanPolicy())

    assert batch.ledger().topic_ids == {"orders": NEW_ID, "payments": PAYMENTS_ID}
    # deleted meanwhile and created again: refused when it is read again
    again = ids_of(view(q0=(0, 50)), payments=NEW_ID)
    with pytest.raises(TopicIdChanged, match="'payments'"):
        plan_batch(batch.ledger(), again, PlanPolicy())


def test_several_recreated_topics_are_named_in_one_error_with_one_reset() -> None:
    old = ids_in(ledger(p0=3, q0=7), orders=OLD_ID, payments=PAYMENTS_ID)
    now = ids_of(view(p0=(0, 5), q0=(0, 9)), orders=NEW_ID, payments=OLD_ID)

    with pytest.raises(TopicIdChanged) as caught:
        plan_batch(old, now, PlanPolicy())

    assert caught.value.changed == (("orders", OLD_ID, NEW_ID), ("payments", PAYMENTS_ID, OLD_ID))
    assert "topics 'orders', 'payments' were deleted" in str(caught.value)
    assert "--to-offsets orders:0=0,payments:0=0 " in str(caught.value)


@pytest.mark.parametrize("side", ["ledger", "kafka"])
def test_without_an_id_on_either_side_the_offsets_are_checked_as_before(side: str) -> None:
    # a ledger written before ids were kept (format 1 or 2), or a broker that gives none
    old = ledger(p0=150) if side == "ledger" else ids_in(ledger(p0=150), orders=OLD_ID)
    now = view(p0=(0, 225)) if side == "kafka" else ids_of(view(p0=(0, 225)), orders=NEW_ID)

    assert plan_batch(old, now, PlanPolicy()).ranges() == [(P0, 150, 225)]
    shorter = dataclasses.replace(now, partitions={P0: Watermarks(0, 100)})
    with pytest.raises(TopicRecreated, match="deleted and recreated"):
        plan_batch(old, shorter, PlanPolicy())
    # and the ledger a batch of it commits records the id Kafka gives, from then on
    assert plan_batch(old, now, PlanPolicy()).ledger().topic_ids == (
        {"orders": NEW_ID} if side == "ledger" else {"orders": OLD_ID}
    )


def test_an_unknown_cluster_id_on_either_side_is_not_a_change() -> None:
    assert plan_batch(ledger(p0=3, cluster=None), view(p0=(0, 10)), PlanPolicy()).start == {P0: 3}
    assert plan_batch(ledger(p0=3), view(cluster=None, p0=(0, 10)), PlanPolicy()).start == {P0: 3}


# --- batch numbers and moves_ledger ------------------------------------------------------------


def test_batch_numbers_increment_from_the_ledger() -> None:
    first = plan_batch(None, view(p0=(0, 10)), PlanPolicy(max_records=4))
    assert first.number == 1

    after_first = Ledger(batch=first.number, offsets=first.end, cluster_id=first.cluster_id)
    second = plan_batch(after_first, view(p0=(0, 10)), PlanPolicy(max_records=4))
    assert second.number == 2
    assert second.start == {P0: 4} and second.end == {P0: 8}


def test_first_batch_moves_the_ledger_if_there_are_partitions() -> None:
    assert plan_batch(None, view(p0=(0, 0)), PlanPolicy()).moves_ledger
    assert not plan_batch(None, view(), PlanPolicy()).moves_ledger


def test_an_unchanged_ledger_without_new_data_does_not_move() -> None:
    batch = plan_batch(ledger(p0=10, p1=4), view(p0=(0, 10), p1=(2, 4)), PlanPolicy())

    assert not batch.moves_ledger
    assert batch.ranges() == []


def test_new_data_moves_the_ledger() -> None:
    assert plan_batch(ledger(p0=10), view(p0=(0, 11)), PlanPolicy()).moves_ledger


def test_a_new_empty_partition_moves_the_ledger() -> None:
    # the ledger covers every known partition, idle ones included
    batch = plan_batch(ledger(p0=10), view(p0=(0, 10), p1=(0, 0)), PlanPolicy())

    assert batch.ranges() == []
    assert batch.moves_ledger


def test_ranges_skip_empty_partitions_in_partition_order() -> None:
    batch = Batch(number=1, base=None, start={P2: 0, P0: 3, P1: 5}, end={P2: 4, P0: 7, P1: 5}, cluster_id=None)

    assert batch.ranges() == [(P0, 3, 7), (P2, 0, 4)]
    assert batch.planned_records == 8


def test_a_topic_no_longer_configured_keeps_its_offsets_and_reads_nothing() -> None:
    batch = plan_batch(ledger(p0=3, q0=40), view(p0=(0, 10)), PlanPolicy())

    assert batch.end[Q0] == batch.start[Q0] == 40  # adding the topic back resumes exactly here
    assert batch.ranges() == [(P0, 3, 10)]


def test_a_configured_topic_that_lost_a_partition_still_means_it_was_recreated() -> None:
    with pytest.raises(TopicRecreated, match=r"orders\[1\]"):
        plan_batch(ledger(p0=3, p1=3, q0=40), view(p0=(0, 10), q0=(0, 50)), PlanPolicy())


# --- ending a batch early --------------------------------------------------------------------


def test_a_batch_ends_before_the_given_offsets_inside_its_ranges_and_keeps_the_rest() -> None:
    batch = Batch(4, ledger(p0=10, p1=20, p2=5), {P0: 10, P1: 20, P2: 5}, {P0: 50, P1: 60, P2: 5}, CLUSTER)

    early = batch.ending_before({P0: 30, P1: 60, P2: 5, Q0: 1})  # P1's end and P2's empty range hold nothing

    assert early is not None
    assert (early.number, early.base, early.start) == (4, batch.base, batch.start)
    assert dict(early.end) == {P0: 30, P1: 60, P2: 5}
    assert early.ranges() == [(P0, 10, 30), (P1, 20, 60)] and early.moves_ledger


def test_a_batch_does_not_end_early_where_that_cuts_nothing_or_leaves_nothing_to_read() -> None:
    batch = Batch(4, ledger(p0=10, p1=20), {P0: 10, P1: 20}, {P0: 50, P1: 60}, CLUSTER)

    assert batch.ending_before({P0: 9, P1: 60}) is None  # before the range, at its end: nothing cut
    assert batch.ending_before({P0: 10, P1: 20}) is None  # each range's first record: nothing left
    assert batch.ending_before({P0: 10}) == Batch(4, batch.base, batch.start, {P0: 10, P1: 60}, CLUSTER)


# --- complete through: partitions read to their end --------------------------------------------

READ_AT = 1_764_900_000_000


def at(now: KafkaView, read_at: int = READ_AT) -> KafkaView:
    return dataclasses.replace(now, read_at_ms=read_at)


def test_a_partition_the_batch_reads_to_its_end_is_complete_through_when_that_end_was_read() -> None:
    batch = plan_batch(ledger(p0=0, p1=0), at(view(p0=(0, 100), p1=(0, 10))), PlanPolicy(max_records=30))

    assert batch.end == {P0: 20, P1: 10}
    assert batch.caught_up == {P1: READ_AT}  # p0 has 80 more to read
    committed = batch.ledger({P0: 1_700_000_000_000, P1: 1_600_000_000_000})
    assert committed.caught_up == {P1: READ_AT}
    # p1's newest record is the oldest, yet all it held is in: p0's newest record is the limit
    assert committed.valid_through == 1_700_000_000_000


def test_an_idle_partition_does_not_hold_valid_through_back_while_a_busy_one_moves_on() -> None:
    idle_last, busy_last = 1_600_000_000_000, READ_AT + 50_000
    first = plan_batch(ledger(p0=0, p1=0), at(view(p0=(0, 10), p1=(0, 10))), PlanPolicy())
    after_first = first.ledger({P0: READ_AT - 1_000, P1: idle_last})
    assert after_first.valid_through == READ_AT  # both read to their end: complete through then

    # an hour later the busy partition got 100 records, more than a batch takes; the idle one none
    later = at(view(p0=(0, 110), p1=(0, 10)), READ_AT + 3_600_000)
    second = plan_batch(after_first, later, PlanPolicy(max_records=50))
    after_second = second.ledger({P0: busy_last, P1: idle_last})

    assert after_second.caught_up == {P0: READ_AT, P1: READ_AT + 3_600_000}
    assert after_second.complete_through == {P0: busy_last, P1: READ_AT + 3_600_000}
    assert after_second.valid_through == busy_last  # not the idle partition's last record, long past


def test_a_partition_behind_an_open_transaction_is_not_read_to_its_end() -> None:
    # its readable end (last stable offset) is 10, but records of an open transaction lie past it:
    # written before the end was read, they become readable later, below newer records
    open_transaction = KafkaView(CLUSTER, {P0: Watermarks(0, 10, 14), P1: Watermarks(0, 10, 10)}, read_at_ms=READ_AT)

    batch = plan_batch(ledger(p0=0, p1=0), open_transaction, PlanPolicy())

    assert batch.end == {P0: 10, P1: 10}
    assert batch.caught_up == {P1: READ_AT}


def test_without_the_time_the_end_was_read_no_partition_counts_as_read_to_its_end() -> None:
    assert plan_batch(ledger(p0=0), view(p0=(0, 10)), PlanPolicy()).caught_up == {}


def test_a_partition_behind_or_no_longer_read_keeps_when_it_was_last_read_to_its_end() -> None:
    base = dataclasses.replace(ledger(p0=10, q0=7), caught_up={P0: READ_AT - 5, Q0: READ_AT - 9})
    batch = plan_batch(base, at(view(p0=(0, 20))), PlanPolicy(max_records=5))

    # p0 is behind now, and payments is no longer read: each keeps the time it was last at its end
    assert batch.caught_up == {}
    assert batch.ledger().caught_up == {P0: READ_AT - 5, Q0: READ_AT - 9}
