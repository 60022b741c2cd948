"""The ledger codec and the ancestry lookup (ingest.core.ledger_codec): pure, nothing running."""

from __future__ import annotations

import base64
import json
import random
import zlib
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.core.ledger import (
    RESET_MEMORY,
    AppliedReset,
    BatchCounts,
    DeadLetterSync,
    Ledger,
    LostRange,
    SnapshotView,
    TopicPartition,
    reads_after,
    rewind_of,
)
from ingest.core.ledger_codec import (
    FORMAT_VERSION,
    OWES_DEAD_LETTERS_FORMAT,
    READABLE_FORMATS,
    REGISTRY_PROPERTY,
    decode,
    decode_counts,
    encode,
    find_ledger,
    register,
    registered_pipelines,
)
from ingest.errors import ExitCode, IngestError, LedgerFormatError

A0 = TopicPartition("orders", 0)
A1 = TopicPartition("orders", 1)
B0 = TopicPartition("payments", 0)


def full_ledger() -> Ledger:
    return Ledger(
        batch=7,
        offsets={A0: 120, A1: 99, B0: 5},
        start_offsets={A0: 100, A1: 99, B0: 0},
        cluster_id="kafka-cluster-xyz",
        timestamps={A0: 1_700_000_300_000, A1: 1_700_000_100_000, B0: 1_700_000_200_000},
        lost=(LostRange(A0, 40, 60), LostRange(B0, 0, 3)),
        topic_ids={"orders": "GCRqv5ExRvmLGBc9uuOoNQ", "payments": "uNtjX0cYT6K1pW3v_9Bfsw"},
        caught_up={A1: 1_700_000_250_000, B0: 1_700_000_250_000},
        read={A0: ((0, 50), (80, 120)), A1: ((10, 99),), B0: ()},
    )


# --- encode / decode ---------------------------------------------------------------------------


def test_round_trip_keeps_every_field() -> None:
    ledger = full_ledger()
    summary = encode("orders", ledger, BatchCounts(records=18, dead_letters=2, bytes=4096))

    assert decode("orders", summary) == ledger
    assert decode_counts("orders", summary) == BatchCounts(records=18, dead_letters=2, bytes=4096)


def test_summary_layout_matches_the_protocol() -> None:
    summary = encode("orders", full_ledger(), BatchCounts(records=18, dead_letters=2, bytes=4096))

    # a topic's partitions 0..n-1 as a list: the offsets stay readable in any engine's snapshots table
    assert json.loads(summary["ingest.orders.offsets"]) == {"orders": [120, 99], "payments": [5]}
    detail = json.loads(zlib.decompress(base64.b64decode(summary["ingest.orders.detail"])))
    assert detail == {
        "read": {"orders": [20, 0], "payments": [5]},
        "start": {},
        "time-base": 1_700_000_100_000,
        "times": {"orders": [200_000, 0], "payments": [100_000]},
        "origin": {},
        "topic-ids": {"orders": "GCRqv5ExRvmLGBc9uuOoNQ", "payments": "uNtjX0cYT6K1pW3v_9Bfsw"},
        "caught-up-base": 1_700_000_250_000,
        "caught-up": {"orders": {"1": 0}, "payments": [0]},
        # the ranges the ledger's line has read, per partition
        "read-spans": {"orders": {"0": [[0, 50], [80, 120]], "1": [[10, 99]]}, "payments": {"0": []}},
    }
    assert "ingest.orders.start-offsets" not in summary and "ingest.orders.timestamps" not in summary
    assert summary["ingest.orders.batch"] == "7"
    assert summary["ingest.orders.format"] == str(FORMAT_VERSION)
    assert summary["ingest.orders.kafka-cluster"] == "kafka-cluster-xyz"
    assert json.loads(summary["ingest.orders.lost-ranges"]) == [["orders", 0, 40, 60], ["payments", 0, 0, 3]]
    assert summary["ingest.orders.records"] == "18"
    assert summary["ingest.orders.dead-letters"] == "2"
    assert summary["ingest.orders.bytes"] == "4096"
    # every value is a string: Iceberg snapshot summaries are string -> string
    assert all(isinstance(v, str) for v in summary.values())


def test_partitions_other_than_0_to_n_are_keyed_by_number() -> None:
    ledger = Ledger(batch=3, offsets={A1: 7, B0: 2}, start_offsets={A1: 5, A0: 1, B0: 2})
    summary = encode("p", ledger, BatchCounts())

    assert json.loads(summary["ingest.p.offsets"]) == {"orders": {"1": 7}, "payments": [2]}
    assert decode("p", summary) == ledger


def test_a_format_1_ledger_is_still_read() -> None:
    # what lakehouse-ingest wrote before format 2: every map nested per partition, in its own key
    summary = {
        "ingest.orders.format": "1",
        "ingest.orders.batch": "7",
        "ingest.orders.offsets": '{"orders":{"0":120,"1":99},"payments":{"0":5}}',
        "ingest.orders.start-offsets": '{"orders":{"0":100,"1":99},"payments":{"0":0}}',
        "ingest.orders.timestamps": '{"orders":{"0":1700000300000,"1":1700000100000},"payments":{"0":1700000200000}}',
        "ingest.orders.origin": '{"orders":{"0":0,"1":0},"payments":{"0":0}}',
        "ingest.orders.kafka-cluster": "kafka-cluster-xyz",
        "ingest.orders.lost-ranges": '[["orders",0,40,60],["payments",0,0,3]]',
    }

    assert decode("orders", summary) == replace(
        full_ledger(), origin={A0: 0, A1: 0, B0: 0}, topic_ids={}, caught_up={}, read=None
    )


def test_a_format_2_ledger_is_read_without_topic_ids_or_caught_up_times() -> None:
    # what lakehouse-ingest wrote before topic ids were kept: the same keys, a detail without them
    detail = {
        "read": {"orders": [20, 0], "payments": [5]},
        "start": {},
        "time-base": 1_700_000_100_000,
        "times": {"orders": [200_000, 0], "payments": [100_000]},
        "origin": {"orders": [0, 0], "payments": [0]},
    }
    summary = encode("orders", full_ledger(), BatchCounts())
    summary["ingest.orders.format"] = "2"
    summary["ingest.orders.detail"] = base64.b64encode(zlib.compress(json.dumps(detail).encode())).decode()

    decoded = decode("orders", summary)

    assert decoded == replace(full_ledger(), origin={A0: 0, A1: 0, B0: 0}, topic_ids={}, caught_up={}, read=None)
    assert decoded is not None and decoded.valid_through == 1_700_000_100_000  # the newest records' alone


def test_topic_ids_make_format_3_which_a_version_reading_formats_1_and_2_refuses() -> None:
    summary = encode("orders", full_ledger(), BatchCounts())

    # an older version checks the format first: it stops ("Upgrade lakehouse-ingest") rather than
    # commit ledgers without the ids it cannot read, and so let a recreated topic through
    assert summary["ingest.orders.format"] == "3" == str(FORMAT_VERSION)
    assert decode("orders", summary) == full_ledger()


def test_a_corrupted_detail_key_is_a_ledger_format_error() -> None:
    summary = encode("orders", full_ledger(), BatchCounts())
    summary["ingest.orders.detail"] = "not base64 of zlib!"

    with pytest.raises(LedgerFormatError, match=r"ingest\.orders\.detail"):
        decode("orders", summary)


def test_a_ledger_of_1000_partitions_is_a_fraction_of_format_1() -> None:
    rng = random.Random(7)
    tps = [TopicPartition(f"events_{t:03d}", p) for t in range(200) for p in range(5)]
    offsets = {tp: rng.randint(10**6, 5 * 10**7) for tp in tps}
    ledger = Ledger(
        batch=9,
        offsets=offsets,
        start_offsets={tp: o - rng.randint(300, 700) for tp, o in offsets.items()},
        timestamps={tp: 1_764_900_000_000 - rng.randint(0, 300_000) for tp in tps},
        origin={tp: 0 for tp in tps},
        topic_ids={
            f"events_{t:03d}": base64.urlsafe_b64encode(rng.randbytes(16)).decode().rstrip("=") for t in range(200)
        },
        # most read to their end by this batch's plan, the busiest by earlier ones
        caught_up={tp: 1_764_900_300_000 - (60_000 if rng.random() < 0.1 else 0) for tp in tps},
    )
    summary = encode("p", ledger, BatchCounts())
    assert decode("p", summary) == ledger
    size = sum(len(k) + len(v) for k, v in summary.items())
    # what the line read costs nothing where it is all of [origin, offset), a few bytes where not
    gapped = {**{tp: ((0, o),) for tp, o in offsets.items()}, tps[3]: ((0, 5), (9, offsets[tps[3]]))}
    with_reads = encode("p", replace(ledger, read=gapped), BatchCounts())
    assert decode("p", with_reads) == replace(ledger, read=gapped)
    assert sum(len(k) + len(v) for k, v in with_reads.items()) < size + 100
    format_1 = 0  # its four maps, nested per partition
    for values in (ledger.offsets, ledger.start_offsets, ledger.timestamps, ledger.origin):
        nested: dict[str, dict[str, int]] = {}
        for tp, value in values.items():
            nested.setdefault(tp.topic, {})[str(tp.partition)] = value
        format_1 += len(json.dumps(nested, separators=(",", ":")))
    # format 1 wrote ~61 KB for this ledger without the topic ids; the offsets alone, readable, are
    # ~11 KB of it, the 200 topic ids (random: they do not compress) ~6.5 KB of this format's 29 KB
    assert format_1 > 55_000
    assert size < format_1 / 2, (size, format_1)


def test_valid_through_is_the_oldest_partition_timestamp_without_caught_up_times() -> None:
    ledger = replace(full_ledger(), caught_up={})
    summary = encode("orders", ledger, BatchCounts())

    assert ledger.valid_through == 1_700_000_100_000
    assert summary["ingest.orders.valid-through"] == "1700000100000"


def test_a_partition_read_to_its_end_is_complete_through_then_however_old_its_newest_record() -> None:
    ledger = full_ledger()  # orders[1]'s newest record is the oldest, but it was read to its end later
    summary = encode("orders", ledger, BatchCounts())

    assert ledger.complete_through == {A0: 1_700_000_300_000, A1: 1_700_000_250_000, B0: 1_700_000_250_000}
    assert ledger.valid_through == 1_700_000_250_000
    assert summary["ingest.orders.valid-through"] == "1700000250000"
    # a newest record later than when the partition was last read to its end counts as before
    assert replace(ledger, caught_up={A0: 1_700_000_000_000}).complete_through[A0] == 1_700_000_300_000
    # a partition that never had a record counts once read to its end
    assert Ledger(batch=1, offsets={A0: 0}, caught_up={A0: 5}).valid_through == 5


def test_minimal_ledger_omits_optional_keys_and_round_trips() -> None:
    ledger = Ledger(batch=1, offsets={A0: 0})
    summary = encode("p", ledger, BatchCounts())

    assert "ingest.p.kafka-cluster" not in summary
    assert "ingest.p.valid-through" not in summary
    assert "ingest.p.lost-ranges" not in summary
    assert ledger.valid_through is None
    decoded = decode("p", summary)
    assert decoded == ledger
    assert decoded is not None and decoded.cluster_id is None and decoded.lost == ()


def test_decode_of_a_summary_without_optional_keys_uses_defaults() -> None:
    # what an older writer (or a hand-written summary) might carry: offsets and batch only
    summary = {"ingest.p.offsets": '{"orders":{"0":5}}', "ingest.p.batch": "2"}

    assert decode("p", summary) == Ledger(batch=2, offsets={A0: 5})
    assert decode_counts("p", summary) == BatchCounts()


tps = st.builds(TopicPartition, st.sampled_from(["a", "b.c", "d-e_f"]), st.integers(0, 64))
offset_maps = st.dictionaries(tps, st.integers(0, 2**62), max_size=6)


@given(
    batch=st.integers(1, 2**40),
    offsets=offset_maps,
    starts=offset_maps,
    timestamps=st.dictionaries(tps, st.integers(0, 2**45), max_size=6),
    cluster=st.none() | st.text(min_size=1, max_size=20),
    lost=st.lists(st.builds(LostRange, tps, st.integers(0, 100), st.integers(100, 200)), max_size=3),
    topic_ids=st.dictionaries(st.sampled_from(["a", "b.c", "d-e_f"]), st.text(min_size=1, max_size=24)),
    caught_up=st.dictionaries(tps, st.integers(0, 2**45), max_size=6),
)
def test_round_trip_property(
    batch: int,
    offsets: dict[TopicPartition, int],
    starts: dict[TopicPartition, int],
    timestamps: dict[TopicPartition, int],
    cluster: str | None,
    lost: list[LostRange],
    topic_ids: dict[str, str],
    caught_up: dict[TopicPartition, int],
) -> None:
    ledger = Ledger(batch, offsets, starts, cluster, timestamps, tuple(lost), topic_ids=topic_ids, caught_up=caught_up)

    assert decode("pipe-1", encode("pipe-1", ledger, BatchCounts())) == ledger


# --- scoping by pipeline id --------------------------------------------------------------------


def test_two_pipelines_in_one_summary_do_not_see_each_other() -> None:
    orders = Ledger(batch=3, offsets={A0: 10}, cluster_id="c1")
    payments = Ledger(batch=9, offsets={B0: 77}, cluster_id="c2")
    summary = {
        **encode("orders", orders, BatchCounts(records=1)),
        **encode("payments", payments, BatchCounts(records=2)),
    }

    assert decode("orders", summary) == orders
    assert decode("payments", summary) == payments
    assert decode_counts("orders", summary).records == 1
    assert decode_counts("payments", summary).records == 2
    assert decode("inventory", summary) is None
    assert all(k.startswith(("ingest.orders.", "ingest.payments.")) for k in summary)


def test_a_pipeline_whose_name_is_a_prefix_of_another_is_separate() -> None:
    summary = encode("orders-eu", Ledger(batch=1, offsets={A0: 1}), BatchCounts())

    assert decode("orders", summary) is None


def test_a_summary_without_ledger_keys_is_not_this_pipelines() -> None:
    assert decode("orders", {}) is None
    assert decode("orders", {"operation": "replace", "added-data-files": "3"}) is None


# --- format versions ---------------------------------------------------------------------------


def test_unknown_format_version_raises_with_an_upgrade_message() -> None:
    summary = encode("orders", Ledger(batch=1, offsets={A0: 1}), BatchCounts())
    summary["ingest.orders.format"] = str(max(READABLE_FORMATS) + 1)

    with pytest.raises(LedgerFormatError, match=r"Upgrade lakehouse-ingest") as caught:
        decode("orders", summary)
    assert f"format {max(READABLE_FORMATS) + 1}" in str(caught.value)
    assert "'orders'" in str(caught.value)


def test_unknown_format_of_another_pipeline_does_not_concern_this_one() -> None:
    summary = {
        **encode("orders", Ledger(batch=1, offsets={A0: 1}), BatchCounts()),
        **encode("payments", Ledger(batch=1, offsets={B0: 1}), BatchCounts()),
    }
    summary["ingest.payments.format"] = "99"

    assert decode("orders", summary) == Ledger(batch=1, offsets={A0: 1})


def test_find_ledger_does_not_skip_past_a_snapshot_it_cannot_read() -> None:
    # walking past a newer-format snapshot to an older ledger would resume too early (duplicates)
    newer = encode("orders", Ledger(batch=2, offsets={A0: 20}), BatchCounts())
    newer["ingest.orders.format"] = str(max(READABLE_FORMATS) + 1)
    older = encode("orders", Ledger(batch=1, offsets={A0: 10}), BatchCounts())

    with pytest.raises(LedgerFormatError):
        find_ledger("orders", [SnapshotView(2, newer), SnapshotView(1, older)])


def test_a_future_format_without_the_v1_offsets_key_is_not_silently_skipped() -> None:
    # was: decode() checked the format only when the offsets key was present
    newer = {
        "ingest.orders.format": str(max(READABLE_FORMATS) + 1),
        "ingest.orders.batch": "2",
        "ingest.orders.ledger": "{}",
    }
    older = encode("orders", Ledger(batch=1, offsets={A0: 10}), BatchCounts())

    with pytest.raises(LedgerFormatError):
        find_ledger("orders", [SnapshotView(2, newer), SnapshotView(1, older)])


def test_this_pipelines_format_key_without_offsets_is_a_corrupted_ledger_not_a_foreign_snapshot() -> None:
    summary = {"ingest.orders.format": str(FORMAT_VERSION), "ingest.orders.batch": "3"}

    with pytest.raises(LedgerFormatError, match="no offsets"):
        decode("orders", summary)


# --- find_ledger -------------------------------------------------------------------------------


def _snap(snapshot_id: int, pipeline: str | None, batch: int = 1, offset: int = 0) -> SnapshotView:
    if pipeline is None:
        return SnapshotView(snapshot_id, {"operation": "replace", "deleted-data-files": "4"})
    return SnapshotView(snapshot_id, encode(pipeline, Ledger(batch, {A0: offset}), BatchCounts()))


def test_find_ledger_skips_foreign_snapshots_and_returns_the_newest_of_this_pipeline() -> None:
    ancestry = [
        _snap(60, None),  # compaction
        _snap(50, "payments", batch=40, offset=999),  # another pipeline feeding the same table
        _snap(40, None),
        _snap(30, "orders", batch=3, offset=300),
        _snap(20, "orders", batch=2, offset=200),
    ]

    found = find_ledger("orders", ancestry)

    assert found is not None
    assert found.snapshot_id == 30
    assert found.ledger == Ledger(3, {A0: 300})


def test_find_ledger_returns_the_head_when_it_carries_the_ledger() -> None:
    found = find_ledger("orders", [_snap(2, "orders", 2, 20), _snap(1, "orders", 1, 10)])

    assert found is not None and found.snapshot_id == 2 and found.ledger.batch == 2


def test_find_ledger_stops_reading_at_the_first_match() -> None:
    def ancestry() -> Iterator[SnapshotView]:
        yield _snap(2, "orders", 2, 20)
        raise AssertionError("walked past the ledger-bearing snapshot")

    found = find_ledger("orders", ancestry())

    assert found is not None and found.snapshot_id == 2


def test_find_ledger_on_an_empty_ancestry_is_none() -> None:
    assert find_ledger("orders", []) is None


def test_find_ledger_on_a_broken_ancestry_without_this_pipeline_is_none() -> None:
    # expiry removed the parents: the chain ends after foreign snapshots only
    assert find_ledger("orders", iter([_snap(9, None), _snap(8, "payments")])) is None


# --- the pipeline registry (table property) ----------------------------------------------------


def test_registered_pipelines_of_a_fresh_table_is_empty() -> None:
    assert registered_pipelines({}) == []
    assert registered_pipelines({REGISTRY_PROPERTY: ""}) == []


def test_register_adds_a_pipeline_once_and_keeps_the_others() -> None:
    first = register({}, "orders")
    assert first == {REGISTRY_PROPERTY: "orders"}

    props = {"write.format.default": "parquet", **first}
    second = register(props, "payments")
    assert registered_pipelines({**props, **second}) == ["orders", "payments"]

    assert register({**props, **second}, "orders") == {}
    assert register({**props, **second}, "payments") == {}


def test_registered_pipelines_matches_whole_names_only() -> None:
    props = {REGISTRY_PROPERTY: "orders-eu,payments"}

    assert "orders" not in registered_pipelines(props)
    assert register(props, "orders") == {REGISTRY_PROPERTY: "orders-eu,payments,orders"}


def test_reset_ids_round_trip_and_are_bounded() -> None:
    tp = TopicPartition("t", 0)
    resets = tuple(AppliedReset(f"r{i}", ((tp, 100, i),)) for i in range(RESET_MEMORY + 5))
    ledger = Ledger(batch=3, offsets={tp: 1}, reset_id="r9", resets=resets)

    decoded = decode("p", encode("p", ledger, BatchCounts()))

    assert decoded is not None and decoded.reset_id == "r9"
    assert decoded.resets == resets[-RESET_MEMORY:]
    assert decoded.remembers(f"r{RESET_MEMORY + 4}") and not decoded.remembers("r0")


def test_an_unreadable_ledger_is_a_fatal_ingest_error() -> None:
    with pytest.raises(LedgerFormatError) as caught:
        decode("p", {"ingest.p.format": "9", "ingest.p.offsets": "{}"})
    assert isinstance(caught.value, IngestError) and caught.value.exit_code == ExitCode.FATAL


@pytest.mark.parametrize(
    "sync",
    [
        DeadLetterSync("rollback-1", rewind_to={TopicPartition("t", 0): 5, TopicPartition("u", 2): 0}),
        DeadLetterSync("publish-2", branch="replay-42"),
        DeadLetterSync("dead-letters-3", files=("s3://lake/t/data/00000-0-a.parquet",), count=7),
    ],
)
def test_a_dead_letter_sync_marker_round_trips(sync: DeadLetterSync) -> None:
    ledger = Ledger(batch=3, offsets={TopicPartition("t", 0): 5}, sync=sync)

    decoded = decode("p", encode("p", ledger, BatchCounts()))

    assert decoded is not None and decoded.sync == sync


def test_a_ledger_that_owes_a_batch_s_dead_letters_is_one_older_versions_refuse() -> None:
    """A version that cannot add a batch's dead letters must not commit on top of its rows: it
    reads the ledger's format as newer than it knows (and says to upgrade); other ledgers keep
    the format every version reads."""
    owing = Ledger(batch=3, offsets={A0: 5}, sync=DeadLetterSync("dead-letters-1", files=("f",), count=1))

    assert encode("orders", owing, BatchCounts())["ingest.orders.format"] == str(OWES_DEAD_LETTERS_FORMAT)
    assert OWES_DEAD_LETTERS_FORMAT > FORMAT_VERSION
    plain = encode("orders", Ledger(batch=4, offsets={A0: 6}), BatchCounts())
    assert plain["ingest.orders.format"] == str(FORMAT_VERSION)


# --- what a line has read, and where a rollback rewinds the dead letters ---------------------------


def test_a_line_reads_its_batches_ranges_merged_and_a_reset_reads_nothing() -> None:
    first = Ledger(batch=1, offsets={A0: 10}, start_offsets={A0: 0}, read=reads_after(None, {A0: 0}, {A0: 10}))
    assert first.read == {A0: ((0, 10),)}
    # a forward reset to 20, then a batch: a gap; a backward reset to 5, then a batch: an overlap
    assert reads_after(first, {A0: 20}, {A0: 30}) == {A0: ((0, 10), (20, 30))}
    gapped = Ledger(batch=3, offsets={A0: 30}, read={A0: ((0, 10), (20, 30))})
    assert reads_after(gapped, {A0: 5}, {A0: 25}) == {A0: ((0, 30),)}
    # a ledger written before reads were kept: everything below its offsets counts as read
    assert reads_after(Ledger(batch=1, offsets={A0: 10}), {A0: 10}, {A0: 12}) == {A0: ((0, 12),)}


def test_a_rollback_rewinds_to_what_the_line_read_less_its_gaps() -> None:
    # after a backward reset to 5 the offsets are below what the line read: its dead letters stay
    after_reset = Ledger(batch=4, offsets={A0: 5, A1: 0}, read={A0: ((0, 10), (20, 30))})
    assert rewind_of(after_reset) == ({A0: 30, A1: 0}, {A0: ((10, 20),)})
    # the first read began above 0 (start: latest): below it, a gap
    assert rewind_of(Ledger(batch=1, offsets={A0: 9}, read={A0: ((4, 9),)})) == ({A0: 9}, {A0: ((0, 4),)})
    # a ledger written before reads were kept: its offsets, no gaps (what rollbacks always did)
    assert rewind_of(Ledger(batch=2, offsets={A0: 5})) == ({A0: 5}, {})


def test_a_rollbacks_marker_keeps_its_gaps() -> None:
    sync = DeadLetterSync("rollback-7-abc", rewind_to={A0: 30}, rewind_gaps={A0: ((10, 20),)})
    ledger = Ledger(batch=4, offsets={A0: 5}, sync=sync)

    decoded = decode("orders", encode("orders", ledger, BatchCounts()))
    assert decoded is not None and decoded.sync == sync
