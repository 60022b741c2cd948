"""Where each Avro body ends, for many values at once, without decoding them.

Polars decodes a block of records, or refuses the whole block without saying which record broke
it. To find the poison among thousands of values in one pass, the binary encoding is walked here
with numpy over all the values together, one field at a time: a varint's length, a string's
length prefix, a union's branch, an array's blocks. A value is a misfit when the walk leaves its
bytes (cut short) or meets what no encoder writes (a union
branch or an enum index out of range, a negative length, a varint over ten bytes). The misfits
are set aside, a value with bytes after its record is read as its record (as confluent-kafka's
deserializer and fastavro read it); the rest are then decoded by polars as one block, which stays the judge of what it
decodes (a string that is not UTF-8 is still found by bisection).

The walk follows the resolved writer schema (:class:`~ingest.formats.avro_schema.Node`), so it
covers what decoding covers: primitives, logical types, decimals, fixed, enums, optional unions,
records, arrays and maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.formats.avro_schema import Node

Ints = npt.NDArray[np.int64]

#: the bytes of each fixed-size kind
_FIXED_SIZE = {"boolean": 1, "float": 4, "double": 8}
#: the kinds encoded as a zigzag varint
_VARINT = {"int", "long", "date", "time", "timestamp", "timestamptz"}
#: the kinds encoded as a length and that many bytes
_LENGTH = {"string", "binary", "decimal"}


class _Walk:
    """The positions of every value's next unread byte, advanced field by field; a value whose
    encoding breaks leaves the walk, its reason kept."""

    def __init__(self, values: Sequence[bytes], start: int) -> None:
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.pos = self.starts + start
        # ten bytes of padding: a varint may be read past the last value before its end is checked
        self.buf = np.frombuffer(b"".join(values) + bytes(10), np.uint8)
        self.why: dict[int, str] = {}

    def broken(self, idx: Ints, broken: npt.NDArray[np.bool_], reason: str) -> None:
        """The values of ``idx`` that ``broken`` marks leave the walk with ``reason``."""
        if broken.any():
            self.why.update(dict.fromkeys(idx[broken].tolist(), reason))

    def inside(self, idx: Ints) -> npt.NDArray[np.bool_]:
        """Which values of ``idx`` are not read past their end (the others leave, cut short)."""
        inside = self.pos[idx] <= self.ends[idx]
        self.broken(idx, ~inside, "the value ends inside its record: cut short")
        return inside

    def varint(self, idx: Ints, numbers: bool = True) -> tuple[Ints, Ints]:
        """The values of ``idx`` whose next bytes are a varint, and (``numbers``) its zigzag-decoded
        number; their positions moved past it."""
        start = self.pos[idx]
        byte = self.buf[start]  # the first byte of all, then the next of those that go on
        number = (byte & 0x7F).astype(np.uint64) if numbers else byte
        size = np.ones(len(idx), np.int64)
        live = np.flatnonzero(byte >= 0x80)
        for k in range(1, 10):
            if not live.size:
                break
            byte = self.buf[start[live] + k]
            if numbers:
                number[live] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            size[live] = k + 1
            live = live[byte >= 0x80]
        size[live] = 0  # still going after ten bytes
        self.pos[idx] = start + size
        unended = size == 0
        self.broken(idx, unended, "a number longer than ten bytes")
        keep = ~unended & self.inside(idx)
        if not numbers:
            return idx[keep], idx
        decoded = (number >> np.uint64(1)).astype(np.int64) ^ -(number & np.uint64(1)).astype(np.int64)
        return idx[keep], decoded[keep]

    def skip(self, idx: Ints, size: Ints | int) -> Ints:
        self.pos[idx] += size
        return idx[self.inside(idx)]

    def checked(self, idx: Ints, number: Ints, count: int, what: str) -> tuple[Ints, Ints]:
        """The values of ``idx`` whose ``number`` is an index below ``count``."""
        broken = (number < 0) | (number >= count)
        self.broken(idx, broken, f"{what} {count}")
        return idx[~broken], number[~broken]

    def node(self, node: Node, idx: Ints) -> Ints:
        """Every value of ``idx`` past one ``node``; the ones still walking."""
        if not node.optional:
            return self._present(node, node.avro, idx)
        branches = node.avro
        idx, branch = self.checked(*self.varint(idx), len(branches), "a union branch outside the schema's")
        present = branch != branches.index("null")
        inner = next(b for b in branches if b != "null")
        if present.all():
            return self._present(node, inner, idx)
        return np.concatenate([idx[~present], self._present(node, inner, idx[present])])

    def _present(self, node: Node, avro: Any, idx: Ints) -> Ints:
        kind = node.kind
        if not idx.size:
            return idx
        if kind == "record":
            for _, child in node.fields:
                idx = self.node(child, idx)
            return idx
        if kind in _FIXED_SIZE:
            return self.skip(idx, _FIXED_SIZE[kind])
        if isinstance(avro, dict) and avro.get("type") == "fixed":
            return self.skip(idx, int(avro["size"]))
        if kind in _VARINT:
            return self.varint(idx, numbers=False)[0]
        if kind == "enum":
            return self.checked(*self.varint(idx), len(node.symbols), "an enum index outside the schema's")[0]
        if kind in _LENGTH:
            return self._bytes(idx)
        if kind in ("array", "map"):
            return self._blocks(node, idx)
        raise AssertionError(f"an Avro kind the walk does not know: {kind}")

    def _bytes(self, idx: Ints) -> Ints:
        idx, length = self.varint(idx)
        broken = (length < 0) | (length > self.ends[idx] - self.pos[idx])
        self.broken(idx, broken, "a length that is negative or past the value's end")
        return self.skip(idx[~broken], length[~broken])

    def _blocks(self, node: Node, idx: Ints) -> Ints:
        """Arrays and maps: blocks of a count (negative: followed by the block's size in bytes,
        read and not needed) and as many items, until a count of 0."""
        assert node.items is not None
        done: list[Ints] = []
        while idx.size:
            idx, count = self.varint(idx)
            ended = count == 0
            done.append(idx[ended])
            idx, count = idx[~ended], count[~ended]
            sized = count < 0
            if sized.any():
                kept = ~sized | np.isin(idx, self.varint(idx[sized])[0])
                idx, count = idx[kept], np.abs(count[kept])
            # a count beyond the bytes left cannot be (every item takes one byte or more: _walkable)
            broken = count > self.ends[idx] - self.pos[idx]
            self.broken(idx, broken, "a count of items past the value's end")
            idx, count = idx[~broken], count[~broken]
            for item in range(int(count.max(initial=0))):
                live = count > item
                more = idx[live]
                if node.kind == "map":
                    more = self._bytes(more)
                lost = live & ~np.isin(idx, self.node(node.items, more))
                idx, count = idx[~lost], count[~lost]
        return np.concatenate(done)


def _least(node: Node) -> int:
    """The fewest bytes ``node`` is encoded in."""
    if node.optional or node.kind in ("array", "map"):
        return 1
    if node.kind == "record":
        return sum(_least(child) for _, child in node.fields)
    if isinstance(node.avro, dict) and node.avro.get("type") == "fixed":
        return int(node.avro["size"])
    return _FIXED_SIZE.get(node.kind, 1)


def _walkable(node: Node) -> bool:
    """Whether every array's and map's items take a byte or more (a count is then bounded by the
    bytes left, and a corrupt count cannot keep the walk going)."""
    if node.kind in ("array", "map"):
        assert node.items is not None
        return (node.kind == "map" or _least(node.items) > 0) and _walkable(node.items)
    return all(_walkable(child) for _, child in node.fields)


@dataclass(frozen=True)
class Walked:
    """What the walk found of each value: those that are not a record of the schema, with why,
    and the length of those with bytes after their record (as confluent-kafka's deserializer and
    fastavro read such a value: its record, the rest ignored)."""

    misfits: dict[int, str]
    longer: dict[int, int]


def walk(node: Node, values: Sequence[bytes], start: int = 0) -> Walked | None:
    """Each of ``values`` walked from ``start`` as one record of ``node`` (the writer schema
    resolved); None for a schema the walk cannot bound (an array of empty records)."""
    if not _walkable(node):
        return None
    walked = _Walk(values, start)
    idx = walked.node(node, np.arange(len(values), dtype=np.int64))
    over = idx[walked.ends[idx] > walked.pos[idx]]
    longer = dict(zip(over.tolist(), (walked.pos[over] - walked.starts[over]).tolist(), strict=True))
    return Walked(dict(sorted(walked.why.items())), longer)
