"""The commit decision and the dead-letter floor (ingest.core.commit)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.batch_commit import BatchCommit, commit_batch, land_dead_letters
from ingest.core.commit import Decision, dead_letter_step, decide
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition
from ingest.core.ledger_codec import decode, encode, find_ledger
from ingest.core.plan import Batch
from ingest.dead_letter_spool import DeadLetterSpool
from ingest.testing.memory_state import Crashed, Fault, MemoryFile
from ingest.testing.memory_table import MemoryCatalog, MemoryTable

P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)


def batch_from(base: Ledger | None, end: dict[TopicPartition, int]) -> Batch:
    start = dict(base.offsets) if base is not None else dict.fromkeys(end, 0)
    return Batch(number=(base.batch + 1) if base is not None else 1, base=base, start=start, end=end, cluster_id="c")


BASE = Ledger(batch=4, offsets={P0: 10, P1: 20}, cluster_id="c")
BATCH = batch_from(BASE, {P0: 15, P1: 22})


# --- decide ------------------------------------------------------------------------------------


def test_commit_when_the_head_still_carries_the_base_ledger() -> None:
    assert decide(Ledger(batch=4, offsets={P0: 10, P1: 20}), BATCH) is Decision.COMMIT


def test_commit_compares_ledgers_by_value_not_identity() -> None:
    # the observed ledger was decoded from a summary: equal, but another object (and mapping type)
    observed = Ledger(batch=4, offsets=dict(reversed(list(BASE.offsets.items()))), cluster_id="c")

    assert decide(observed, BATCH) is Decision.COMMIT


def test_commit_for_a_fresh_pipeline() -> None:
    assert decide(None, batch_from(None, {P0: 5})) is Decision.COMMIT


def test_landed_when_the_head_carries_this_batchs_end_with_the_same_number() -> None:
    assert decide(Ledger(batch=5, offsets={P0: 15, P1: 22}), BATCH) is Decision.LANDED


def test_landed_for_a_fresh_pipelines_first_batch() -> None:
    first = batch_from(None, {P0: 5})

    assert decide(Ledger(batch=1, offsets={P0: 5}), first) is Decision.LANDED


def test_fenced_by_another_writers_batch_with_a_different_end() -> None:
    assert decide(Ledger(batch=5, offsets={P0: 12, P1: 22}), BATCH) is Decision.FENCED


def test_fenced_by_the_same_end_under_a_different_batch_number() -> None:
    # e.g. two later batches that together reached the same offsets: not this batch's commit
    assert decide(Ledger(batch=6, offsets={P0: 15, P1: 22}), BATCH) is Decision.FENCED


def test_fenced_when_the_ledger_moved_further() -> None:
    assert decide(Ledger(batch=9, offsets={P0: 99, P1: 99}), BATCH) is Decision.FENCED


def test_fenced_when_a_fresh_pipeline_finds_another_writers_first_batch() -> None:
    assert decide(Ledger(batch=1, offsets={P0: 3}), batch_from(None, {P0: 5})) is Decision.FENCED


def test_fenced_when_the_ledger_vanished_under_a_planned_batch() -> None:
    # planned from a ledger, but the head now has none (rolled back past the first batch)
    assert decide(None, BATCH) is Decision.FENCED


def test_base_with_the_right_offsets_but_another_number_is_not_the_base() -> None:
    assert decide(Ledger(batch=3, offsets={P0: 10, P1: 20}), BATCH) is Decision.FENCED


def test_a_ledger_with_an_extra_partition_is_not_the_base() -> None:
    observed = Ledger(batch=4, offsets={P0: 10, P1: 20, TopicPartition("orders", 2): 0})

    assert decide(observed, BATCH) is Decision.FENCED


# --- dead_letter_step --------------------------------------------------------------------------


def test_absent_floor_keeps_everything_and_moves_to_the_batch_end() -> None:
    step = dead_letter_step(None, BATCH)

    assert step.floor == {}
    assert step.keeps(P0, 0) and step.keeps(P0, 10) and step.keeps(P1, 21)
    assert step.new_floor == {P0: 15, P1: 22}
    assert step.moves


def test_floor_keeps_offsets_at_or_above_it_only() -> None:
    step = dead_letter_step(Ledger(batch=2, offsets={P0: 12}), BATCH)

    assert not step.keeps(P0, 11)
    assert step.keeps(P0, 12)
    assert step.keeps(P0, 14)
    assert step.keeps(P1, 20)  # no floor on this partition: keep


def test_new_floor_is_the_max_of_floor_and_end_per_partition() -> None:
    # floor ahead on P0 (a crash between the two commits), behind on P1 (no bad records lately),
    # and a partition of the dead-letter ledger that this batch does not cover
    other = TopicPartition("payments", 0)
    step = dead_letter_step(Ledger(batch=3, offsets={P0: 40, P1: 5, other: 7}), BATCH)

    assert step.new_floor == {P0: 40, P1: 22, other: 7}
    assert step.moves


def test_a_floor_at_or_beyond_the_batch_end_does_not_move() -> None:
    step = dead_letter_step(Ledger(batch=3, offsets={P0: 15, P1: 30}), BATCH)

    assert step.new_floor == {P0: 15, P1: 30}
    assert not step.moves
    # below the floor: looked up in the table, not taken as there (another decoding may have put
    # other records there, a forward reset may have skipped them)
    assert all(step.looks_up(P0, o) and not step.keeps(P0, o) for o in range(10, 15))


def test_a_batch_past_a_gap_moves_the_floor_and_a_reread_below_it_is_looked_up() -> None:
    """Partition 1 reset forward from 5 to 20 (offsets 5..19 never read), a batch [20, 22), then a
    backward reset that reads 5..19: their dead letters are looked up, not taken as there."""
    after_gap = dead_letter_step(Ledger(batch=3, offsets={P0: 10, P1: 5}), BATCH)
    assert after_gap.new_floor[P1] == 22

    reread = batch_from(Ledger(batch=5, offsets={P0: 10, P1: 5}), {P0: 10, P1: 20})
    step = dead_letter_step(Ledger(batch=4, offsets=after_gap.new_floor), reread)
    assert all(step.looks_up(P1, o) for o in range(5, 20))
    assert step.new_floor[P1] == 22


floors = st.dictionaries(st.sampled_from([P0, P1]), st.integers(0, 50))
ends = st.fixed_dictionaries({P0: st.integers(10, 60), P1: st.integers(20, 60)})


@given(floor=floors, end=ends, tp=st.sampled_from([P0, P1]), offset=st.integers(0, 80))
def test_dead_letter_step_properties(
    floor: dict[TopicPartition, int], end: dict[TopicPartition, int], tp: TopicPartition, offset: int
) -> None:
    step = dead_letter_step(Ledger(batch=1, offsets=floor) if floor else None, batch_from(BASE, end))

    assert step.keeps(tp, offset) == (offset >= floor.get(tp, 0))
    for p in set(floor) | set(end):
        assert step.new_floor[p] == max(floor.get(p, end.get(p, 0)), end.get(p, 0))
    # the floor never moves back
    assert all(step.new_floor[p] >= f for p, f in floor.items())


@pytest.mark.parametrize("floor", [None, Ledger(batch=1, offsets={P0: 12, P1: 21})])
def test_running_the_same_batch_twice_keeps_nothing_the_second_time(floor: Ledger | None) -> None:
    first = dead_letter_step(floor, BATCH)
    after = Ledger(batch=2, offsets=first.new_floor)
    second = dead_letter_step(after, BATCH)

    dead = [(P0, 10), (P0, 13), (P1, 20), (P1, 21)]
    assert [d for d in dead if second.keeps(*d)] == []  # all looked up: the first run's are there
    assert not second.moves


# --- resets ------------------------------------------------------------------------------------


def test_a_reset_to_exactly_this_batchs_end_fences_it() -> None:
    # its snapshot holds none of the batch's records: the batch must not count as landed
    reset = Ledger(batch=5, offsets={P0: 15, P1: 22}, reset_id="r-1")

    assert decide(reset, BATCH) is Decision.FENCED


def test_a_reset_whose_own_commit_landed_is_recognised() -> None:
    reset_batch = Batch(number=5, base=BASE, start=BASE.offsets, end={P0: 0, P1: 0}, cluster_id="c", reset_id="r-1")

    assert decide(Ledger(batch=5, offsets={P0: 0, P1: 0}, reset_id="r-1"), reset_batch) is Decision.LANDED
    assert decide(Ledger(batch=5, offsets={P0: 0, P1: 0}, reset_id="r-2"), reset_batch) is Decision.FENCED


def _letters(*offsets: int) -> pa.Table:
    return pa.table(
        {
            "topic": pa.array(["orders"] * len(offsets)),
            "partition": pa.array([0] * len(offsets), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
        }
    )


def _tables() -> tuple[MemoryCatalog, MemoryCatalog]:
    rows, dead = MemoryCatalog("lake.orders"), MemoryCatalog("lake.orders_dead_letter")
    rows.append(encode("orders", BASE, BatchCounts()))
    return rows, dead


def _dead_offsets(dead: MemoryCatalog) -> list[int]:
    """The offsets of the dead letters the dead-letter table's head holds, sorted."""
    letters = dead.scan()
    assert letters is not None, "the dead-letter table holds no files"
    return sorted(letters["offset"].to_pylist())


def _request(dead_letters: pa.Table, records: int = 3) -> BatchCommit:
    counts = BatchCounts(records=records, dead_letters=dead_letters.num_rows)
    return BatchCommit("orders", BATCH, BATCH.ledger(), [], DeadLetterSpool.of(dead_letters), counts, 3)


def test_dead_letters_are_added_once_the_rows_commit_landed_and_remembered() -> None:
    rows, dead = _tables()

    committed = commit_batch(rows.table(), dead.table(), _request(_letters(11, 13)))

    assert committed is not None and committed.decision is Decision.COMMIT and committed.dead_letters == 2
    rows_ledger = decode("orders", rows.snapshots()[-1].summary)
    assert rows_ledger is not None and rows_ledger.sync is not None and rows_ledger.sync.count == 2
    assert _dead_offsets(dead) == [11, 13]
    floor = decode("orders", dead.snapshots()[-1].summary)
    assert floor is not None and floor.remembers(rows_ledger.sync.sync_id) and dict(floor.offsets) == BATCH.end
    assert [branch for branch, _ in rows.log + dead.log].count("main") == 3  # base, rows, dead letters


def test_a_copy_whose_batch_another_decoding_landed_adds_no_dead_letters() -> None:
    """Copies of one batch under two decodings (a rolling deploy of a fix): the lenient one lands
    it with every record a row; the strict one, which made two dead letters, finds the batch landed
    and adds nothing: those records are rows."""
    rows, dead = _tables()
    strict_rows, strict_dead = rows.table(), dead.table()  # planned before the lenient copy landed
    assert commit_batch(rows.table(), dead.table(), _request(_letters(), records=5)) is not None

    late = commit_batch(strict_rows, strict_dead, _request(_letters(11, 13)))

    assert late is not None and late.decision is Decision.LANDED and late.dead_letters == 0
    assert dead.scan() is None


def test_a_late_copy_does_not_put_back_a_dead_letter_redrive_moved_to_the_rows() -> None:
    """Copies A and B of one batch; A lands (rows, then dead letters), ``ingest redrive`` then
    removes a dead letter A added (it is in the rows now), and B comes late: the batch landed, so it
    adds nothing."""
    rows, dead = _tables()
    late_rows, late_dead = rows.table(), dead.table()  # B's handles
    assert commit_batch(rows.table(), dead.table(), _request(_letters(11, 13))) is not None
    floor = find_ledger("orders", dead.table().ancestry())
    assert floor is not None
    dead.delete(encode("orders", floor.ledger, BatchCounts()), lambda data: pc.equal(data["offset"], 11))  # redrive

    late = commit_batch(late_rows, late_dead, _request(_letters(11, 13)))

    assert late is not None and late.decision is Decision.LANDED
    assert _dead_offsets(dead) == [13]


def test_a_crash_between_the_rows_and_the_dead_letters_is_finished_by_whoever_comes_next() -> None:
    """The rows commit lands and the process dies before adding its dead letters: they are in
    files only. The next run (under another decoding, even) adds exactly those files, once."""
    rows, dead = _tables()

    def crash_at_dead_letters(table: MemoryTable) -> Fault:
        return "crash-before" if table.catalog is dead else "ok"

    dead.on_commit = crash_at_dead_letters
    with pytest.raises(Crashed):
        commit_batch(rows.table(), dead.table(), _request(_letters(11)))
    dead.on_commit = lambda table: "ok"
    assert dead.scan() is None
    head = find_ledger("orders", rows.table().ancestry())
    assert head is not None

    assert land_dead_letters(dead.table(), rows.table(), "orders", head.ledger, 3) == 1
    assert land_dead_letters(dead.table(), rows.table(), "orders", head.ledger, 3) == 0  # once
    assert _dead_offsets(dead) == [11]


def test_dead_letters_of_a_marker_the_rows_left_behind_are_not_added() -> None:
    """A rollback moved the rows off a batch whose dead letters were never added: its rows are
    gone from main, so its dead letters must not appear either."""
    rows, dead = _tables()
    dead.on_commit = lambda table: "crash-before" if table.catalog is dead else "ok"
    with pytest.raises(Crashed):
        commit_batch(rows.table(), dead.table(), _request(_letters(11)))
    dead.on_commit = lambda table: "ok"
    left = find_ledger("orders", rows.table().ancestry())
    assert left is not None
    rows.append(encode("orders", BASE, BatchCounts(), {"restamped-by": "rollback"}))  # main back at the base

    assert land_dead_letters(dead.table(), rows.table(), "orders", left.ledger, 3) == 0
    assert dead.scan() is None


def test_a_re_read_below_the_floor_stores_no_dead_letter_twice() -> None:
    """After a backward reset a batch reads records whose dead letters are stored: only those the
    table lacks are written (offset 13, which a forward reset had skipped before)."""
    rows, dead = _tables()
    [stored] = dead.table().write(_letters(11))
    assert isinstance(stored, MemoryFile)
    dead.append(encode("orders", Ledger(batch=1, offsets={P0: 15}), BatchCounts()), [stored])

    committed = commit_batch(rows.table(), dead.table(), _request(_letters(11, 13)))

    assert committed is not None and committed.dead_letters == 1
    assert _dead_offsets(dead) == [11, 13]
