"""Sharing a batch's ranges between processes (how many: ingest.engines.local.processes; how:
ingest.core.ranges.share and ingest.engines.tasks.hand_off) and checking that their results cover it
exactly (combine): no Kafka needed."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.config import parse
from ingest.core.ledger import TopicPartition
from ingest.core.ranges import Range, share
from ingest.core.ranges import coverage_problem as combine_problem
from ingest.engines.local import processes
from ingest.engines.task_spec import TaskSpec
from ingest.engines.tasks import hand_off
from ingest.kafka.reading import Stops
from ingest.records import HEADERS_COLUMN, HEADERS_TYPE, KEY_COLUMN, Field, RawChunk

ranges_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 10_000), st.integers(0, 3_000)), max_size=8, unique_by=lambda r: r[0]
).map(lambda items: [(TopicPartition("t", p), start, start + size) for p, start, size in items])


@given(ranges_strategy, st.integers(1, 16))
def test_shares_cover_every_offset_once_in_near_equal_groups(ranges: list[Range], parts: int) -> None:
    groups = share(ranges, parts)

    total = sum(end - start for _, start, end in ranges)
    assert len(groups) == min(parts, total)
    assert all(group for group in groups)
    sizes = [sum(end - start for _, start, end in group) for group in groups]
    assert sum(sizes) == total
    assert not sizes or max(sizes) - min(sizes) <= 1
    for tp, start, end in ranges:
        pieces = sorted((s, e) for group in groups for t, s, e in group if t == tp)
        assert all(e > s for s, e in pieces)
        if end == start:
            assert pieces == []
            continue
        assert pieces[0][0] == start and pieces[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))  # contiguous, no overlap


def test_a_group_takes_whole_ranges_where_it_can() -> None:
    a, b, c = (TopicPartition("t", p) for p in range(3))

    groups = share([(a, 0, 100), (b, 50, 150), (c, 0, 100)], 2)

    assert groups == [[(a, 0, 100), (b, 50, 100)], [(b, 100, 150), (c, 0, 100)]]
    assert share([(a, 5, 5)], 4) == []
    assert share([(a, 0, 3)], 8) == [[(a, 0, 1)], [(a, 1, 2)], [(a, 2, 3)]]


@given(
    ranges_strategy,
    st.lists(st.floats(0, 1), min_size=8, max_size=8),
    st.integers(1, 8),
    st.integers(1, 2_000),
)
def test_a_hand_off_gives_away_only_unread_offsets_and_loses_none(
    ranges: list[Range], read: list[float], parts: int, least: int
) -> None:
    stops = Stops(ranges)
    for (tp, start, end), fraction in zip(ranges, read, strict=False):
        if end > start:
            stops.position[tp] = start + int((end - start) * fraction)
    before = {tp: stops.position[tp] for tp in stops.end}

    given = hand_off(stops, parts, least)

    unread = sum(end - before[tp] for tp, _, end in ranges if end > start_of(ranges, tp))
    kept = sum(stops.end[tp] - before[tp] for tp in stops.end)
    sizes = [kept] + [sum(end - start for _, start, end in group) for group in given]
    assert len(given) <= parts
    assert all(size >= least for size in sizes[1:])
    assert sum(sizes) == unread
    if given:
        assert max(sizes) - min(sizes) <= 1
    # what the reader read, what it keeps and what it gave away cover each range exactly once
    read_and_kept = [(tp, start, stops.end[tp]) for tp, start, end in ranges if end > start]
    assert combine_problem(ranges, read_and_kept + [r for group in given for r in group]) is None
    assert all(stops.end[tp] >= before[tp] for tp in stops.end)  # nothing read is taken back


def start_of(ranges: list[Range], tp: TopicPartition) -> int:
    return next(start for t, start, _ in ranges if t == tp)


def test_nothing_is_handed_off_when_the_shares_would_be_too_small() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    stops = Stops([(a, 0, 100), (b, 0, 100)])
    stops.position[a] = 90

    # 110 unread: two shares of 55 (the reader keeps a's last 10 and b's first 45), not four of 27
    assert hand_off(stops, 3, least=40) == [[(b, 45, 100)]]
    assert stops.end == {a: 100, b: 45}
    assert hand_off(stops, 3, least=40) == []  # 55 unread: one share
    assert stops.end == {a: 100, b: 45}


def test_results_that_miss_or_double_offsets_are_refused() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    batch = [(a, 0, 100), (b, 10, 10)]

    assert combine_problem(batch, [(a, 50, 100), (a, 0, 50)]) is None
    assert "missed offsets of t[0] from 40" in str(combine_problem(batch, [(a, 0, 40), (a, 50, 100)]))
    assert "read twice offsets of t[0] from 40" in str(combine_problem(batch, [(a, 0, 60), (a, 40, 100)]))
    assert "up to 90, not 100" in str(combine_problem(batch, [(a, 0, 90)]))
    assert "does not cover" in str(combine_problem(batch, [(a, 0, 100), (b, 10, 11)]))


@pytest.mark.parametrize(
    ("chunk_records", "workers", "records", "expected"),
    [
        (1_000_000, 2, 999_999, 1),  # one chunk of under 1M records: a worker would not pay off
        (1_000_000, 4, 1_000_000, 2),  # one chunk of 1M: two processes, never more
        (1_000_000, 4, 1_999_999, 2),
        (1_000_000, 4, 3_000_000, 3),  # one process per chunk
        (1_000_000, 2, 3_000_000, 2),  # at most `workers`
        (100_000, 8, 350_000, 3),  # small chunks: one process per chunk
        (100_000, 8, 150_000, 1),
        (1_000_000, 1, 5_000_000, 1),  # workers: 1 keeps one process
    ],
)
def test_one_process_per_chunk_and_two_for_one_large_chunk(
    chunk_records: int, workers: int, records: int, expected: int
) -> None:
    config = parse(
        {
            "pipeline": "orders",
            "kafka": {"bootstrap.servers": "unused:9092"},
            "topics": ["orders"],
            "catalog": {"name": "memory"},
            "table": "lake.orders",
            "schema": [{"name": "id", "type": "long"}],
            "batch": {"chunk_records": chunk_records, "workers": workers},
        }
    )
    assert processes(config, records) == expected
    assert processes(config) == workers


@pytest.mark.parametrize("headers", [True, False])
def test_a_keyed_decoder_with_the_headers_column_on_or_off(headers: bool) -> None:
    """A table that has ``_kafka_headers`` (its fields the table's, as without ``schema:``) and
    keys: with ``headers: true`` the column is filled; turned off, the rows leave it out (null)."""
    config = parse(
        {
            "pipeline": "orders",
            "kafka": {"bootstrap.servers": "unused:9092"},
            "topics": [{"name": "orders", "key_format": "string"}],
            "catalog": {"name": "memory"},
            "table": "lake.orders",
            "schema": [{"name": "id", "type": "long"}],
            "headers": headers,
        },
        "memory.yaml",
    )
    fields = [
        Field("id", "long"),
        Field(KEY_COLUMN, "string"),
        Field(HEADERS_COLUMN, HEADERS_TYPE),
    ]
    chunk = RawChunk(
        topic=pa.array(["orders"] * 2),
        partition=pa.array([0, 0], pa.int32()),
        offset=pa.array([0, 1], pa.int64()),
        timestamp=pa.array([0, 0], pa.timestamp("us", tz="UTC")),
        key=pa.array([b"a", b"b"]),
        values=[b'{"id": 1}', b'{"id": 2}'],
        headers=lambda i: [("trace", str(i).encode())],
        nbytes=18,
    )

    decoded = TaskSpec.of(config, fields).decoder().decode(chunk)

    assert decoded.rows["id"].to_pylist() == [1, 2] and decoded.rows[KEY_COLUMN].to_pylist() == ["a", "b"]
    if headers:
        assert decoded.rows[HEADERS_COLUMN].to_pylist() == [[("trace", b"0")], [("trace", b"1")]]
    else:
        assert HEADERS_COLUMN not in decoded.rows.column_names
