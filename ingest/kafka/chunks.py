"""Raw chunks: the messages a read consumed, as the columns a batch decodes.

A read of exact ranges hands librdkafka's messages over in chunks (:class:`~ingest.records.RawChunk`):
topic, partition, offset, timestamp, key and headers as Arrow columns, the values as bytes. Building
them is the reader's main cost after librdkafka's own, so each field is taken in one pass over the
messages. A fetch returns whole record batches, so messages past their range's end are dropped here.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from ingest.records import Headers, RawChunk

_SECOND = operator.itemgetter(1)
_NO_END = np.iinfo(np.int64).max


def build_chunk(messages: list[Message], ends: Mapping[tuple[str, int], int], value_bytes: int) -> RawChunk:
    """Column-wise arrays of consumed messages, without those past their range's end;
    ``value_bytes``: the size of their values, as the reader counted them.

    A fetch returns whole record batches, so messages past ``end`` can arrive before the
    partition is unassigned; they belong to the next batch and are dropped here.
    """
    # one pass per field with map() into numpy: the per-message method calls are the reader's
    # main cost (the GIL is held throughout), so nothing else here works per message
    count = len(messages)
    names = sorted({topic for topic, _ in ends})
    limits = np.full((len(names), max(partition for _, partition in ends) + 1), _NO_END, np.int64)
    for (topic, partition), end in ends.items():
        limits[names.index(topic), partition] = end
    partitions = np.fromiter(map(Message.partition, messages), np.int32, count)
    offsets = np.fromiter(map(Message.offset, messages), np.int64, count)
    if len(names) == 1:
        topic_names = None
        past = offsets >= limits[0, partitions]
    else:
        code: dict[str | None, int] = {name: i for i, name in enumerate(names)}
        topic_names = list(map(Message.topic, messages))
        past = offsets >= limits[np.fromiter(map(code.__getitem__, topic_names), np.intp, count), partitions]
    if past.any():
        inside = np.flatnonzero(~past)
        messages = [messages[i] for i in inside]
        partitions, offsets = partitions[inside], offsets[inside]
        topic_names = None if topic_names is None else [topic_names[i] for i in inside]
        count = len(messages)
        value_bytes = sum(map(len, messages))  # len(): the value's size, counted in C
    if topic_names is None:
        topics = pa.repeat(pa.scalar(names[0], pa.string()), count)
    else:
        topics = pa.array(topic_names, type=pa.string())
    values: list[bytes | None] = list(map(Message.value, messages))
    keys = pa.array(list(map(Message.key, messages)), type=pa.binary())
    millis = np.fromiter(map(_SECOND, map(Message.timestamp, messages)), np.int64, count)  # -1: none
    timestamps = pa.array(millis * 1000, pa.int64(), mask=millis < 0).cast(pa.timestamp("us", tz="UTC"))
    nbytes = (pc.sum(pc.binary_length(keys)).as_py() or 0) + value_bytes

    def headers(i: int) -> Headers:
        raw = messages[i].headers()
        if not raw:
            return None
        pairs = raw.items() if isinstance(raw, dict) else raw
        return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]

    return RawChunk(
        topic=topics,
        partition=pa.array(partitions),
        offset=pa.array(offsets),
        timestamp=timestamps,
        key=keys,
        values=values,
        headers=headers,
        nbytes=nbytes,
    )
