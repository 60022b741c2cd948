"""Exact range reads from the real broker: every record of each ``[start, end)`` comes back once,
with its topic, partition, offset, timestamp, key, value and headers, and nothing past the end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import pytest

from ingest.core.ledger import TopicPartition
from ingest.core.ranges import coverage_problem as combine_problem
from ingest.engines.tasks import hand_off
from ingest.kafka.admin import create_topic, produce
from ingest.kafka.reading import Stops
from ingest.kafka.source import KafkaSource
from ingest.records import RawChunk

pytestmark = pytest.mark.integration

PER_PARTITION = 60
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def _record(topic: str, partition: int, offset: int) -> Record:
    key = f"{topic}/{partition}/{offset}".encode() if offset % 3 else None
    value = None if offset % 17 == 5 else b'{"n": %d}' % offset  # some tombstones
    headers = [("seq", str(offset).encode()), ("from", topic.encode())] if offset % 4 == 0 else None
    return key, value, headers


@pytest.fixture(scope="module")
def topics(bootstrap: str) -> tuple[str, str, int, int]:
    names = (f"read-a-{uuid.uuid4().hex[:8]}", f"read-b-{uuid.uuid4().hex[:8]}")
    before = int(time.time() * 1000)
    for name in names:
        create_topic(bootstrap, name, 2)
        produce(bootstrap, name, ((p, *_record(name, p, i)) for i in range(PER_PARTITION) for p in range(2)))
    return *names, before, int(time.time() * 1000)


@pytest.mark.parametrize(
    "wanted",
    [
        # one topic: the chunk's topic column is the topic's name repeated
        [("a", 0, 5, 31), ("a", 1, 0, PER_PARTITION)],
        # two topics, ranges ending mid-partition, a one-record range and an empty one
        [("a", 0, 5, 31), ("a", 1, 12, 13), ("b", 0, 0, 44), ("b", 1, 20, 20)],
    ],
)
def test_exact_ranges_come_back_column_for_column(
    bootstrap: str, topics: tuple[str, str, int, int], wanted: list[tuple[str, int, int, int]]
) -> None:
    a, b, before, after = topics
    name = {"a": a, "b": b}
    ranges = [(TopicPartition(name[t], p), start, end) for t, p, start, end in wanted]
    source = KafkaSource({"bootstrap.servers": bootstrap}, sorted({tp.topic for tp, _, _ in ranges}), "read-test", 20)

    chunks = list(source.read(ranges, chunk_records=7))  # small chunks: fetches overrun the ends
    got = _rows(chunks, before, after)

    expected = [
        (tp.topic, tp.partition, offset, *_record(tp.topic, tp.partition, offset))
        for tp, start, end in ranges
        for offset in range(start, end)
    ]
    assert sorted(got, key=lambda row: row[:3]) == sorted(expected, key=lambda row: row[:3])
    # the bytes a batch reports: keys and values of exactly these records, none past an end
    assert sum(chunk.nbytes for chunk in chunks) == sum(len(row[3] or b"") + len(row[4] or b"") for row in expected)


def test_a_read_hands_off_what_it_has_not_read_and_no_offset_is_lost_or_doubled(
    bootstrap: str, topics: tuple[str, str, int, int]
) -> None:
    a, b, before, after = topics
    ranges = [(TopicPartition(a, 0), 0, PER_PARTITION), (TopicPartition(a, 1), 3, 57), (TopicPartition(b, 0), 10, 50)]
    source = KafkaSource({"bootstrap.servers": bootstrap}, [a, b], "read-test", 20)
    stops = Stops(ranges)
    reading = source.read(stops, chunk_records=5)

    first = next(reading)  # the reader is under way, with more fetched than it has handed on
    given = hand_off(stops, 2)
    got = _rows([first], before, after) + _rows(reading, before, after)
    for share in given:
        got += _rows(source.read(share, chunk_records=5), before, after)

    assert len(given) == 2 and all(share for share in given)
    expected = [
        (tp.topic, tp.partition, offset, *_record(tp.topic, tp.partition, offset))
        for tp, start, end in ranges
        for offset in range(start, end)
    ]
    assert sorted(got, key=lambda row: row[:3]) == sorted(expected, key=lambda row: row[:3])
    assert combine_problem(ranges, stops.ranges() + [r for share in given for r in share]) is None


def _rows(chunks: Iterable[RawChunk], before: int, after: int) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for chunk in chunks:
        columns = zip(
            chunk.topic.to_pylist(),
            chunk.partition.to_pylist(),
            chunk.offset.to_pylist(),
            chunk.key.to_pylist(),
            chunk.values,
            [chunk.headers(i) for i in range(len(chunk))],
            chunk.timestamp.to_pylist(),
            strict=True,
        )
        for topic, partition, offset, key, value, headers, timestamp in columns:
            assert before <= timestamp.timestamp() * 1000 <= after + 1, timestamp
            rows.append((topic, partition, offset, key, value, headers))
    return rows
