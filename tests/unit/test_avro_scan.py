"""Where Avro bodies end, found for many values at once (:mod:`ingest.formats.avro_scan`): checked
against fastavro, which writes the values and reads each one alone. Avro's binary encoding is
prefix-free, so a value cut short or with bytes added is never one record: the walk must find
every such value, and must never set aside a value fastavro reads whole."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

import fastavro
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.formats.avro_scan import misfits
from ingest.formats.avro_schema import resolve
from tests.unit.test_avro import ORDER, order, plain, record

PARSED = fastavro.parse_schema(ORDER)
NODE = resolve(json.dumps(ORDER))

texts = st.text(max_size=12)
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)


@st.composite
def orders(draw: st.DrawFn) -> dict[str, Any]:
    """Orders of every field kind, their lengths and numbers drawn."""
    value = order(0)
    value |= {
        "id": draw(longs),
        "amount": Decimal(draw(st.integers(-(10**9), 10**9))) / 100,
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=draw(st.integers(-50_000, 50_000))),
        "note": draw(st.none() | texts),
        "address": {"city": draw(texts), "zip": draw(st.none() | ints)},
        "billing": draw(st.none() | st.fixed_dictionaries({"city": texts, "zip": st.none() | ints})),
        "tags": draw(st.lists(st.none() | texts, max_size=5)),
        "attrs": draw(st.dictionaries(texts, longs, max_size=4)),
        "status": draw(st.sampled_from(["NEW", "PAID"])),
        "history": draw(st.lists(st.sampled_from(["A", "B"]), max_size=4)),
        "raw": draw(st.binary(max_size=20)),
        "flag": draw(st.booleans()),
    }
    return value


def reads_whole(value: bytes) -> bool:
    """Whether fastavro reads ``value`` as one record, to its last byte."""
    buffer = io.BytesIO(value)
    try:
        fastavro.schemaless_reader(buffer, PARSED, None)
    except Exception:
        return False
    return buffer.tell() == len(value)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(orders(), st.integers(0, 3), st.integers(0, 10_000), st.binary(min_size=1)), min_size=1))
def test_every_value_cut_short_or_lengthened_is_found_and_no_whole_one(
    drawn: list[tuple[dict[str, Any], int, int, bytes]],
) -> None:
    values, spoiled = [], set()
    for i, (value, how, at, extra) in enumerate(drawn):
        encoded = plain(ORDER, value)
        if how == 1:  # cut short
            encoded = encoded[: at % len(encoded)]
        elif how == 2:  # bytes after it
            encoded += extra
        elif how == 3:  # a byte changed
            at %= len(encoded)
            encoded = encoded[:at] + bytes([encoded[at] ^ extra[0] or 1]) + encoded[at + 1 :]
        if how in (1, 2):
            spoiled.add(i)
        values.append(encoded)

    found = misfits(NODE, values)

    assert found is not None
    assert spoiled <= set(found)
    assert not any(reads_whole(values[i]) for i in found)  # a changed byte may still read: then it must stay


def test_each_misfit_says_why_and_a_prefix_is_skipped() -> None:
    good = plain(ORDER, order(1))
    long_name = plain(record("N", ("s", "string")), {"s": "x" * 200})
    values = [
        b"\x00" + bytes(4) + good,
        b"\x00" + bytes(4) + good[:-1],
        b"\x00" + bytes(4) + good + b"\x00",
        b"\x00" + bytes(4) + b"\xff" * 11,
    ]
    assert misfits(NODE, values, start=5) == {
        1: "the value ends inside its record: cut short",
        2: "bytes are left after its record: longer than its schema says",
        3: "a number longer than ten bytes",
    }
    union = resolve(json.dumps(record("U", ("o", ["null", "long"]))))
    assert misfits(union, [b"\x04\x02"]) == {0: "a union branch outside the schema's 2"}
    enum = resolve(json.dumps(record("E", ("e", {"type": "enum", "name": "S", "symbols": ["A", "B"]}))))
    assert misfits(enum, [b"\x02", b"\x04"]) == {1: "an enum index outside the schema's 2"}
    text = resolve(json.dumps(record("N", ("s", "string"))))
    assert misfits(text, [long_name, long_name[:50], b"\x01"]) == {
        1: "a length that is negative or past the value's end",
        2: "a length that is negative or past the value's end",
    }


def test_array_blocks_with_their_size_in_bytes_are_walked() -> None:
    """A writer may write an array's block as a negative count and the block's size in bytes
    (Avro's spec allows it so that readers can skip); fastavro reads it, and so does the walk."""
    schema = record("A", ("xs", {"type": "array", "items": "long"}), ("n", "int"))
    node = resolve(json.dumps(schema))
    # two blocks: -2 items in 2 bytes (1, 2), then 1 item (3), then the end; n = 4
    value = bytes([0x03, 0x04, 0x02, 0x04, 0x02, 0x06, 0x00, 0x08])
    assert fastavro.schemaless_reader(io.BytesIO(value), fastavro.parse_schema(schema), None) == {
        "xs": [1, 2, 3],
        "n": 4,
    }
    assert misfits(node, [value, value[:-1], value + b"\x00", bytes([0x7F]) + value[1:]]) == {
        1: "the value ends inside its record: cut short",
        2: "bytes are left after its record: longer than its schema says",
        3: "a count of items past the value's end",
    }


def test_an_array_of_empty_records_is_not_walked() -> None:
    """An item of no bytes leaves a corrupt count unbounded: such a schema is left to bisection."""
    schema = record("A", ("xs", {"type": "array", "items": record("E")}))
    assert misfits(resolve(json.dumps(schema)), [b"\x00"]) is None
