"""Where Avro bodies end, found for many values at once (:mod:`ingest.formats.avro_scan`): checked
against fastavro, which writes the values and reads each one alone. Avro's binary encoding is
prefix-free, so a value cut short is never a record: the walk must set aside every such value,
and never one fastavro reads; a value with bytes added is its record and more, read as fastavro
and confluent-kafka's deserializer read it (the bytes after it ignored)."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

import fastavro
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.formats.avro_scan import Walked, walk
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


def read_length(value: bytes) -> int | None:
    """How many bytes fastavro reads of ``value`` as one record (None: it cannot)."""
    buffer = io.BytesIO(value)
    try:
        fastavro.schemaless_reader(buffer, PARSED, None)
    except Exception:
        return None
    return buffer.tell()


def walked(node: Any, values: list[bytes], start: int = 0) -> Walked:
    found = walk(node, values, start)
    assert found is not None
    return found


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(orders(), st.integers(0, 3), st.integers(0, 10_000), st.binary(min_size=1)), min_size=1))
def test_every_value_cut_short_is_set_aside_and_a_lengthened_one_read_as_its_record(
    drawn: list[tuple[dict[str, Any], int, int, bytes]],
) -> None:
    values, short, long = [], set(), {}
    for i, (value, how, at, extra) in enumerate(drawn):
        encoded = plain(ORDER, value)
        if how == 1:  # cut short
            short.add(i)
            encoded = encoded[: at % len(encoded)]
        elif how == 2:  # bytes after it
            long[i] = len(encoded)
            encoded += extra
        elif how == 3:  # a byte changed
            at %= len(encoded)
            encoded = encoded[:at] + bytes([encoded[at] ^ extra[0] or 1]) + encoded[at + 1 :]
        values.append(encoded)

    found = walked(NODE, values)

    assert short <= set(found.misfits)
    assert long.items() <= found.longer.items()
    assert not set(found.misfits) & set(found.longer)
    assert all(read_length(values[i]) is None for i in found.misfits)  # a changed byte may still read
    assert all(read_length(values[i]) == n for i, n in found.longer.items())
    fitting = set(range(len(values))) - set(found.misfits) - set(found.longer)
    assert all(read_length(values[i]) in (None, len(values[i])) for i in fitting)  # (not UTF-8: polars judges)


def test_each_misfit_says_why_and_a_prefix_is_skipped() -> None:
    good = plain(ORDER, order(1))
    long_name = plain(record("N", ("s", "string")), {"s": "x" * 200})
    values = [
        b"\x00" + bytes(4) + good,
        b"\x00" + bytes(4) + good[:-1],
        b"\x00" + bytes(4) + good + b"\x07\x07",
        b"\x00" + bytes(4) + b"\xff" * 11,
    ]
    assert walked(NODE, values, start=5) == Walked(
        {1: "the value ends inside its record: cut short", 3: "a number longer than ten bytes"},
        {2: 5 + len(good)},
    )
    union = resolve(json.dumps(record("U", ("o", ["null", "long"]))))
    assert walked(union, [b"\x04\x02"]).misfits == {0: "a union branch outside the schema's 2"}
    enum = resolve(json.dumps(record("E", ("e", {"type": "enum", "name": "S", "symbols": ["A", "B"]}))))
    assert walked(enum, [b"\x02", b"\x04"]).misfits == {1: "an enum index outside the schema's 2"}
    text = resolve(json.dumps(record("N", ("s", "string"))))
    assert walked(text, [long_name, long_name[:50], b"\x01"]).misfits == {
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
    assert walked(node, [value, value[:-1], value + b"\x00", bytes([0x7F]) + value[1:]]) == Walked(
        {1: "the value ends inside its record: cut short", 3: "a count of items past the value's end"},
        {2: len(value)},
    )


def test_an_array_of_empty_records_is_not_walked() -> None:
    """An item of no bytes leaves a corrupt count unbounded: such a schema is left to bisection."""
    schema = record("A", ("xs", {"type": "array", "items": record("E")}))
    assert walk(resolve(json.dumps(schema)), [b"\x00"]) is None
