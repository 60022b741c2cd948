"""Sharing a batch's ranges between worker processes (ingest.tasks.share): no Kafka needed."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ingest.core.ledger import TopicPartition
from ingest.tasks import share

ranges_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 10_000), st.integers(0, 3_000)), max_size=8, unique_by=lambda r: r[0]
).map(lambda items: [(TopicPartition("t", p), start, start + size) for p, start, size in items])


@given(ranges_strategy, st.integers(1, 16))
def test_shares_cover_every_offset_once_in_near_equal_groups(ranges, parts: int) -> None:
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
