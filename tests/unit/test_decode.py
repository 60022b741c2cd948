"""Decoding Kafka JSON values into Arrow rows, with poison records split off (ingest.formats.json).

Invariant everywhere: every input record is either a row or a dead letter, exactly once, and
rows keep their input order.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, cast

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.config import FieldSpec
from ingest.formats.json import Decoder, _one_object_per_line
from ingest.records import DEAD_LETTER_SCHEMA, EXTRA_COLUMN, KAFKA_COLUMNS, Declared, Decoded, Field, Headers, RawChunk

UTC = dt.UTC
FIELDS = [
    FieldSpec(name="id", type="long", required=True),
    FieldSpec(name="n", type="int"),
    FieldSpec(name="x", type="double"),
    FieldSpec(name="f", type="float"),
    FieldSpec(name="amt", type="decimal(12, 2)"),
    FieldSpec(name="day", type="date"),
    FieldSpec(name="at", type="timestamptz"),
    FieldSpec(name="s", type="string"),
    FieldSpec(name="ok", type="boolean"),
]
TS0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def chunk(
    values: list[bytes | None],
    offsets: list[int] | None = None,
    *,
    topic: str = "orders",
    partition: int = 3,
    keys: list[bytes | None] | None = None,
    headers: Callable[[int], Headers] | None = None,
) -> RawChunk:
    n = len(values)
    offsets = list(range(100, 100 + n)) if offsets is None else offsets
    keys = [f"k{o}".encode() for o in offsets] if keys is None else keys
    return RawChunk(
        topic=pa.array([topic] * n, pa.string()),
        partition=pa.array([partition] * n, pa.int32()),
        offset=pa.array(offsets, pa.int64()),
        timestamp=pa.array([TS0 + dt.timedelta(seconds=o) for o in offsets], pa.timestamp("us", tz="UTC")),
        key=pa.array(keys, pa.binary()),
        values=values,
        headers=headers or (lambda i: None),
        nbytes=sum(len(v or b"") for v in values),
    )


def decode(values: Sequence[bytes | None], fields: Sequence[Declared] = FIELDS, **kwargs: Any) -> Decoded:
    """``values`` decoded as one chunk; ``kwargs`` go to :func:`chunk`."""
    return Decoder(fields).decode(chunk(list(values), **kwargs))


def assert_exactly_once(decoded: Decoded, offsets: list[int]) -> None:
    rows = decoded.rows.column("_kafka_offset").to_pylist()
    dead = decoded.dead_letters.column("offset").to_pylist()
    assert decoded.rows.num_rows + decoded.dead_letters.num_rows == len(offsets)
    assert sorted(rows + dead) == sorted(offsets)
    assert len(set(rows + dead)) == len(offsets)
    assert rows == [o for o in offsets if o in set(rows)]  # input order kept
    assert dead == sorted(dead)


def good(i: int, **extra: Any) -> bytes:
    return json.dumps({"id": i, "s": f"row-{i}", **extra}).encode()


# --- good records ------------------------------------------------------------------------------


def test_good_records_decode_to_the_declared_arrow_types() -> None:
    value = {
        "id": 2**40,
        "n": -7,
        "x": 1.25,
        "f": 2.5,
        "amt": 12.34,
        "day": "2024-01-02",
        "at": "2024-01-02T03:04:05.250+02:00",
        "s": "grüße",
        "ok": True,
        "ignored": {"nested": [1, 2]},  # fields not in the schema are ignored
    }
    decoded = decode([json.dumps(value).encode(), b'{"id": 5, "amt": "99.10", "at": "2024-01-02T03:04:05Z"}'])

    assert decoded.dead_letters.num_rows == 0
    schema = decoded.rows.schema
    assert schema.names == [*KAFKA_COLUMNS.names, *(f.name for f in FIELDS)]
    assert schema.field("id").type == pa.int64() and not schema.field("id").nullable
    assert schema.field("n").type == pa.int32()
    assert schema.field("x").type == pa.float64()
    assert schema.field("f").type == pa.float32()
    assert schema.field("amt").type == pa.decimal128(12, 2)
    assert schema.field("day").type == pa.date32()
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("s").type == pa.string()
    assert schema.field("ok").type == pa.bool_()
    first, second = decoded.rows.to_pylist()
    assert first["id"] == 2**40
    assert first["n"] == -7
    assert first["x"] == 1.25
    assert first["f"] == 2.5
    assert first["amt"] == Decimal("12.34")
    assert first["day"] == dt.date(2024, 1, 2)
    assert first["at"] == dt.datetime(2024, 1, 2, 1, 4, 5, 250_000, tzinfo=UTC)
    assert first["s"] == "grüße"
    assert first["ok"] is True
    assert second["amt"] == Decimal("99.10")  # decimal from a string keeps its exact value
    assert second["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert second["n"] is None and second["s"] is None  # optional fields may be absent


def test_rows_carry_their_kafka_coordinates() -> None:
    decoded = decode([good(1), good(2)], offsets=[7, 9], keys=[b"a", None], topic="t", partition=11)

    rows = decoded.rows.to_pylist()
    assert [(r["_kafka_topic"], r["_kafka_partition"], r["_kafka_offset"], r["_kafka_key"]) for r in rows] == [
        ("t", 11, 7, b"a"),
        ("t", 11, 9, None),
    ]
    assert rows[0]["_kafka_timestamp"] == TS0 + dt.timedelta(seconds=7)


def test_an_integer_is_accepted_for_a_double_and_a_decimal() -> None:
    row = decode([b'{"id": 1, "x": 5, "amt": 7}']).rows.to_pylist()[0]

    assert row["x"] == 5.0 and row["amt"] == Decimal("7.00")


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_a_pretty_printed_multi_line_value_is_kept(eol: bytes) -> None:
    pretty = json.dumps({"id": 7, "s": "multi\nline text"}, indent=2).encode().replace(b"\n", eol)
    assert eol in pretty

    decoded = decode([good(1), pretty, good(3)])

    assert decoded.dead_letters.num_rows == 0
    assert decoded.rows.column("id").to_pylist() == [1, 7, 3]
    assert decoded.rows.column("s").to_pylist()[1] == "multi\nline text"


def test_an_empty_chunk() -> None:
    decoded = decode([])

    assert decoded.rows.num_rows == 0 and decoded.dead_letters.num_rows == 0
    assert decoded.dead_letters.schema == DEAD_LETTER_SCHEMA


# --- bad records -------------------------------------------------------------------------------

BAD = [
    pytest.param(b'{"id": 1, "s": ', "not valid JSON", id="not-json"),
    pytest.param(b"\xff\xfe{}", "not valid JSON", id="not-utf8"),
    pytest.param(b"[1, 2]", "JSON value is not an object (got list)", id="list"),
    pytest.param(b"42", "JSON value is not an object (got int)", id="number"),
    pytest.param(b'"hello"', "JSON value is not an object (got str)", id="string"),
    pytest.param(b"true", "JSON value is not an object (got bool)", id="boolean"),
    pytest.param(None, "value is null (a tombstone)", id="tombstone"),
    pytest.param(b"", "value is empty", id="empty"),
    pytest.param(b" \t ", "value is empty", id="blank"),
    pytest.param(b'{"s": "no id"}', "required field(s) 'id' missing or null", id="missing-required"),
    pytest.param(b'{"id": null, "s": "x"}', "required field(s) 'id' missing or null", id="null-required"),
    pytest.param(b'{"id": "abc"}', "field 'id': expected long, got a JSON string", id="string-for-long"),
    pytest.param(b'{"id": 1, "ok": "yes"}', "field 'ok': expected boolean, got a JSON string", id="string-for-bool"),
    pytest.param(b'{"id": 1, "s": {"a": 1}}', "field 's': expected string, got a JSON object", id="object-for-string"),
    pytest.param(b'{"id": 1, "day": 20240101}', "field 'day': expected date, got a JSON number", id="number-for-date"),
    pytest.param(b'{"id": 1, "day": "2024-02-30"}', "field 'day': cannot convert to date", id="bad-date"),
    pytest.param(b'{"id": 1.5}', "field 'id': cannot convert 1.5 to long", id="fraction-for-long"),
    pytest.param(b'{"id": 1, "amt": 1.234}', "field 'amt': cannot convert 1.234 to decimal(12,2)", id="decimal-scale"),
    pytest.param(b'{"id": 1, "amt": "1.234"}', "field 'amt': cannot convert \"1.234\"", id="decimal-scale-string"),
    pytest.param(b'{"id": 1, "amt": 1234567890123}', "field 'amt'", id="decimal-precision"),
    pytest.param(b'{"id": 1, "n": 3000000000}', "field 'n': cannot convert 3000000000 to int", id="int-overflow"),
    pytest.param(b'{"id": 1, "n": -2147483649}', "field 'n': cannot convert -2147483649 to int", id="int-underflow"),
    pytest.param(b'{"id": 9223372036854775808}', "field 'id': cannot convert", id="long-overflow"),
    pytest.param(
        b'{"id": 1, "at": "yesterday"}', "field 'at': cannot convert \"yesterday\" to timestamptz", id="bad-timestamp"
    ),
    pytest.param(b'{"id": 1}{"id": 2}', "not valid JSON: Extra data", id="two-documents"),
    pytest.param(b'{"id": 1} {"id": 2}', "not valid JSON: Extra data", id="two-documents-spaced"),
    pytest.param(b'{"id": 1}\n{"id": 2}', "not valid JSON: Extra data", id="two-documents-two-lines"),
    pytest.param(b'{\n  "id": "x"\n}', "field 'id': expected long, got a JSON string", id="multi-line-wrong-type"),
    pytest.param(b'{"id": 1, "s": "\\ud800"}', "field 's'", id="lone-surrogate"),
]
#: BAD's (value, message) pairs: each value is bytes or None, which pytest.param keeps as ``object``
BAD_PAIRS = cast(list[tuple[bytes | None, str]], [p.values for p in BAD])


@pytest.mark.parametrize("size", [3, 41], ids=["one-by-one", "bisected"])
@pytest.mark.parametrize(("value", "message"), BAD)
def test_a_bad_record_goes_to_the_dead_letters_and_the_rest_are_kept(
    value: bytes | None, message: str, size: int
) -> None:
    # small chunks are parsed record by record; big ones in one go, bisected around the bad record
    bad_at = size // 2
    values: list[bytes | None] = [good(i) for i in range(size)]
    values[bad_at] = value
    offsets = list(range(100, 100 + size))

    decoded = decode(values)

    assert_exactly_once(decoded, offsets)
    assert decoded.rows.column("id").to_pylist() == [i for i in range(size) if i != bad_at]
    [dead] = decoded.dead_letters.to_pylist()
    assert dead["offset"] == 100 + bad_at
    assert dead["value"] == value  # raw, as read from Kafka (not the re-serialised form)
    assert message in dead["error"]


def test_many_bad_records_in_one_chunk_each_get_their_own_message() -> None:
    bad = BAD_PAIRS
    values: list[bytes | None] = []
    expected_rows = []
    for i, (value, _) in enumerate(bad):
        values += [good(i), value]
        expected_rows.append(i)
    offsets = list(range(100, 100 + len(values)))

    decoded = decode(values)

    assert_exactly_once(decoded, offsets)
    assert decoded.rows.column("id").to_pylist() == expected_rows
    errors = decoded.dead_letters.column("error").to_pylist()
    assert [message in error for (_, message), error in zip(bad, errors, strict=True)] == [True] * len(bad)


def test_a_chunk_of_only_bad_records() -> None:
    values = [None, b"", b"[]", b"{oops"] * 10

    decoded = decode(values)

    assert decoded.rows.num_rows == 0
    assert decoded.rows.schema == Decoder(FIELDS).decode(chunk([good(1)])).rows.schema
    assert_exactly_once(decoded, list(range(100, 140)))


def test_dead_letters_keep_raw_key_value_headers_and_coordinates() -> None:
    calls: list[int] = []

    def headers(i: int) -> Headers:
        calls.append(i)
        return [("trace-id", b"abc"), ("empty", None)] if i == 1 else None

    values = [good(0), b"\x00garbage\n", good(2), None]
    decoded = decode(
        values,
        offsets=[40, 42, 45, 46],
        keys=[b"k0", b"\xffbinary-key", b"k2", None],
        topic="payments",
        partition=5,
        headers=headers,
    )

    assert decoded.dead_letters.schema == DEAD_LETTER_SCHEMA
    first, tombstone = decoded.dead_letters.to_pylist()
    assert first["topic"] == "payments"
    assert first["partition"] == 5
    assert first["offset"] == 42
    assert first["timestamp"] == TS0 + dt.timedelta(seconds=42)
    assert first["key"] == b"\xffbinary-key"
    assert first["value"] == b"\x00garbage\n"
    assert first["headers"] == [{"key": "trace-id", "value": b"abc"}, {"key": "empty", "value": None}]
    assert first["error"].startswith("not valid JSON")
    assert (tombstone["offset"], tombstone["key"], tombstone["value"], tombstone["headers"]) == (46, None, None, [])
    # headers are fetched only for dead letters
    assert sorted(calls) == [1, 3]


def test_non_contiguous_offsets_are_kept_as_they_are() -> None:
    offsets = [10, 11, 15, 20, 21, 30]
    values = [good(0), b"bad", good(2), None, good(4), good(5)]

    decoded = decode(values, offsets=offsets)

    assert_exactly_once(decoded, offsets)
    assert decoded.rows.column("_kafka_offset").to_pylist() == [10, 15, 21, 30]


# --- regressions: each of these was a bug, found by this suite --------------------------------


def _decode_in_subprocess(
    values: list[bytes | None], fields: list[tuple[str, str, bool]]
) -> subprocess.CompletedProcess[str]:
    """Run the decoder in a child process: pyarrow's JSON reader crashes (SIGSEGV) on a payload that
    starts with ``null``, and a regression must fail this test, not kill the test run."""
    script = textwrap.dedent(
        """
        import ast, json, sys
        import pyarrow as pa
        from ingest.config import FieldSpec
        from ingest.formats.json import Decoder
        from ingest.records import RawChunk
        values, fields = ast.literal_eval(sys.stdin.read())
        n = len(values)
        chunk = RawChunk(
            topic=pa.array(["t"] * n), partition=pa.array([0] * n, pa.int32()),
            offset=pa.array(range(n), pa.int64()), timestamp=pa.array([None] * n, pa.timestamp("us", tz="UTC")),
            key=pa.array([None] * n, pa.binary()), values=values, headers=lambda i: None, nbytes=0)
        out = Decoder([FieldSpec(name=a, type=b, required=c) for a, b, c in fields]).decode(chunk)
        print(json.dumps({"rows": out.rows.column("_kafka_offset").to_pylist(),
                          "dead": out.dead_letters.column("offset").to_pylist(),
                          "errors": out.dead_letters.column("error").to_pylist()}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], input=repr((values, fields)), capture_output=True, text=True, timeout=60
    )


def _run(values: list[bytes | None], fields: list[tuple[str, str, bool]]) -> dict[str, Any]:
    result = _decode_in_subprocess(values, fields)
    assert result.returncode == 0, f"the decoder crashed (return code {result.returncode}): {result.stderr[-500:]}"
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("value", [b"null", b" null ", b"null\n"])
def test_a_json_null_value_is_dead_lettered_not_a_crash(value: bytes) -> None:
    # was: SIGSEGV inside pyarrow.json.read_json, so one poison record killed every run
    out = _run([b'{"id": 1}', value, b'{"id": 3}'], [("id", "long", True)])

    assert (out["rows"], out["dead"]) == ([0, 2], [1])
    assert "not an object" in out["errors"][0]


@pytest.mark.parametrize("position", [0, 5, 19])
def test_a_json_null_value_in_a_big_chunk_is_not_kept_as_an_empty_row(position: int) -> None:
    # was: parsed by Arrow as a row of nulls and kept (no required field to catch it), or a crash
    values: list[bytes | None] = [b'{"s": "x"}'] * 20
    values[position] = b"null"

    out = _run(values, [("s", "string", False)])

    assert out["dead"] == [position]
    assert out["rows"] == [i for i in range(20) if i != position]


@pytest.mark.parametrize("amount", [b"12345678901.5", b'"12345678901.5"', b"123456789012"])
def test_a_decimal_that_overflows_its_precision_after_rescaling_is_dead_lettered(amount: bytes) -> None:
    # was: Arrow checked the precision of the literal (12 digits) before rescaling to 13 digits, and
    # kept an invalid decimal128(12, 2) value
    decoded = decode([good(0), b'{"id": 1, "amt": ' + amount + b"}"])

    assert decoded.dead_letters.column("offset").to_pylist() == [101]
    decoded.rows.validate(full=True)


def test_invalid_utf8_inside_a_string_is_dead_lettered() -> None:
    # was: kept as a row whose string column is invalid UTF-8
    decoded = decode([good(0), b'{"id": 1, "s": "\xff"}'])

    assert decoded.dead_letters.column("offset").to_pylist() == [101]
    decoded.rows.validate(full=True)


def test_a_float_out_of_range_is_dead_lettered_not_stored_as_infinity() -> None:
    # was: the unchecked double -> float cast stored inf
    decoded = decode([good(0), b'{"id": 1, "f": 3.4e39}', b'{"id": 2, "f": 3.4e38}', b'{"id": 3, "f": 0.1}'])

    assert decoded.dead_letters.column("offset").to_pylist() == [101]
    assert "field 'f'" in decoded.dead_letters.column("error")[0].as_py()
    # precision loss is what float means; only overflow is refused
    assert decoded.rows.column("f").to_pylist() == [None, pytest.approx(3.4e38, rel=1e-6), pytest.approx(0.1)]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b'{"id": 1, "amt": 1.234}', "amt"),
        (b'{"id": 1, "at": "yesterday"}', "at"),
        (b'{"id": 1e3}', "id"),
        (b'{"id": 1, "n": -2147483649}', "n"),
    ],
)
def test_conversion_errors_name_the_field(value: bytes, field: str) -> None:
    # was: raw Arrow text for parametrised types, and -2147483649 for 'n' blamed on 'id'
    [error] = decode([value]).dead_letters.column("error").to_pylist()

    assert f"field {field!r}" in error


# --- property: random mixes of good and bad ----------------------------------------------------

texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20)
offsets_minutes = st.integers(-12 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
instants = st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1), timezones=offsets_minutes)
good_documents = st.fixed_dictionaries(
    {"id": st.integers(-(2**63), 2**63 - 1)},
    optional={
        "n": st.integers(-(2**31), 2**31 - 1),
        "x": st.floats(allow_nan=False, allow_infinity=False),
        "f": st.floats(allow_nan=False, allow_infinity=False, width=32),
        "amt": st.decimals(min_value=-(10**10) + 1, max_value=10**10 - 1, places=2).map(str),
        "day": st.dates(dt.date(1970, 1, 1), dt.date(2200, 12, 31)).map(dt.date.isoformat),
        "at": instants.map(dt.datetime.isoformat),
        "s": texts | st.none(),
        "ok": st.booleans(),
        "extra": st.lists(st.integers(), max_size=3),
    },
)
# JSON null is left out here on purpose: a regression would crash the whole test run (see the
# subprocess tests above)
bad_values = st.sampled_from([value for value, _ in BAD_PAIRS])
layouts = st.sampled_from(["compact", "pretty", "crlf", "padded"])


def render(document: dict[str, Any], layout: str) -> bytes:
    """A good value as some producer might write it: all of these are one valid JSON object."""
    if layout == "compact":
        return json.dumps(document, separators=(",", ":")).encode()
    if layout == "padded":
        return b"  " + json.dumps(document).encode() + b" \t"
    pretty = json.dumps(document, indent=2).encode()
    return pretty.replace(b"\n", b"\r\n") if layout == "crlf" else pretty


records = st.one_of(
    st.tuples(st.just("good"), st.tuples(good_documents, layouts)),
    st.tuples(st.just("bad"), bad_values),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(records, max_size=70), gaps=st.lists(st.integers(1, 3), min_size=70, max_size=70))
def test_every_record_is_a_row_or_a_dead_letter_exactly_once(items: list[tuple[str, Any]], gaps: list[int]) -> None:
    offsets = [sum(gaps[: i + 1]) for i in range(len(items))]
    values = [render(*payload) if kind == "good" else payload for kind, payload in items]

    decoded = decode(values, offsets=offsets)

    assert_exactly_once(decoded, offsets)
    expected_good = [(o, payload[0]) for o, (kind, payload) in zip(offsets, items, strict=True) if kind == "good"]
    assert decoded.rows.column("_kafka_offset").to_pylist() == [o for o, _ in expected_good]
    for row, (_, doc) in zip(decoded.rows.to_pylist(), expected_good, strict=True):
        assert row["id"] == doc["id"]
        assert row["n"] == doc.get("n")
        assert row["x"] == doc.get("x")
        assert row["f"] == doc.get("f")
        assert row["amt"] == (Decimal(doc["amt"]) if "amt" in doc else None)
        assert row["day"] == (dt.date.fromisoformat(doc["day"]) if "day" in doc else None)
        assert row["at"] == (dt.datetime.fromisoformat(doc["at"]) if "at" in doc else None)
        assert row["s"] == doc.get("s")
        assert row["ok"] == doc.get("ok")
    decoded.rows.validate(full=True)
    dead_values = decoded.dead_letters.column("value").to_pylist()
    assert dead_values == [payload for kind, payload in items if kind == "bad"]
    assert all(decoded.dead_letters.column("error").to_pylist())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(records, min_size=17, max_size=50))
def test_a_chunk_after_a_poisoned_one_gets_the_verdicts_a_fresh_decoder_gives(items: list[tuple[str, Any]]) -> None:
    # a decoder whose last chunk held poison screens the next one before Arrow reads it whole
    values: list[bytes | None] = [render(*payload) if kind == "good" else payload for kind, payload in items]
    unknown: list[bytes | None] = [good(i, extra=i) for i in range(20)]  # fields the table does not declare
    clean: list[bytes | None] = [good(i) for i in range(30)]
    fields: list[Declared] = [*FIELDS, Field(EXTRA_COLUMN, "string")]
    decoder = Decoder(fields, unknown_fields="capture")
    decoder.decode(chunk([good(i) if i % 5 else b'{"id": "x"}' for i in range(40)]))

    for chunk_values in (values, unknown, clean):
        after = decoder.decode(chunk(chunk_values))
        fresh = Decoder(fields, unknown_fields="capture").decode(chunk(chunk_values))

        assert after.rows.to_pylist() == fresh.rows.to_pylist()
        assert after.dead_letters.to_pylist() == fresh.dead_letters.to_pylist()
        assert after.unknown == fresh.unknown


def test_the_chunk_after_a_poisoned_one_is_not_read_whole_by_arrow_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # a topic with poison has it in most chunks: Arrow's read of the whole chunk, refused, is spared
    import ingest.formats.json as json_format

    reads: list[int] = []
    real = json_format._read

    def counted(payload: bytes, block_size: int, options: Any) -> pa.Table:
        reads.append(payload.count(b"\n") + 1)
        return real(payload, block_size, options)

    monkeypatch.setattr(json_format, "_read", counted)
    decoder = Decoder(FIELDS)
    poisoned: list[bytes | None] = [good(i, x=str(i)) if i % 10 == 0 else good(i) for i in range(100)]
    clean: list[bytes | None] = [good(i) for i in range(100)]

    assert decoder.decode(chunk(poisoned)).dead_letters.num_rows == 10
    assert reads == [100, 90]  # refused whole, then the good ones
    assert decoder.decode(chunk(poisoned)).dead_letters.num_rows == 10
    assert reads[2:] == [90]  # the good ones only
    assert decoder.decode(chunk(clean)).dead_letters.num_rows == 0
    assert decoder.decode(chunk(clean)).dead_letters.num_rows == 0
    assert reads[3:] == [100, 100]  # screened once more, then read whole first again


@pytest.mark.parametrize(
    "values",
    [
        [b'{"a":1}', b' {"a":2}'],  # starts with whitespace
        [b'{"a":\n1}', b'{"b":2}'],  # spans lines
        [b'{"a":1}\r', b"{}"],  # carriage return
        [b"[1]"],
        [b'{"a":1}', b'{"a":1}\n{"b":2}'],  # two documents in one value
        [b""],
        [b"{}", b""],  # an empty value last
        [b"", b"{}"],
        [b"\n", b"{}"],
        [b"{}", None],
    ],
)
def test_the_fast_path_refuses_any_chunk_arrow_could_misalign(values: list[bytes | None]) -> None:
    assert _one_object_per_line(values) is None


def test_the_fast_path_takes_one_object_per_line() -> None:
    lines = [b"{}", b'{"a":"x\\ny"}', b'{"b":[1,{"c":2}]}']  # an escaped newline is one line
    values: list[bytes | None] = list(lines)
    assert _one_object_per_line(values) == b"\n".join(lines)


# --- nested fields ------------------------------------------------------------------------------

NESTED = [
    FieldSpec(name="id", type="long", required=True),
    FieldSpec(name="addr", type="struct<city: string, zip: int, since: date>"),
    FieldSpec(name="tags", type="list<string>"),
    FieldSpec(name="items", type="list<struct<sku: string, price: decimal(10, 2), qty: int>>"),
]


def test_nested_objects_and_arrays_decode_into_structs_and_lists() -> None:
    values = [
        {"id": 1, "addr": {"city": "Oslo", "zip": 150, "since": "2020-01-02"}, "tags": ["a", "b"]},
        {"id": 2, "addr": None, "tags": [], "items": [{"sku": "x", "price": "1.50", "qty": 2}, {"sku": "y"}]},
        {"id": 3, "addr": {"city": "Bergen", "unknown": True}},  # a nested field not declared is ignored
    ]
    decoded = decode([json.dumps(v).encode() for v in values], fields=NESTED)

    assert decoded.dead_letters.num_rows == 0
    assert decoded.rows.schema.field("addr").type == pa.struct(
        [("city", pa.string()), ("zip", pa.int32()), ("since", pa.date32())]
    )
    assert decoded.rows.select(["addr", "tags", "items"]).to_pylist() == [
        {"addr": {"city": "Oslo", "zip": 150, "since": dt.date(2020, 1, 2)}, "tags": ["a", "b"], "items": None},
        {
            "addr": None,
            "tags": [],
            "items": [
                {"sku": "x", "price": Decimal("1.50"), "qty": 2},
                {"sku": "y", "price": None, "qty": None},
            ],
        },
        {"addr": {"city": "Bergen", "zip": None, "since": None}, "tags": None, "items": None},
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"addr": {"zip": "ten"}}, "field 'addr.zip': expected int, got a JSON string \"ten\""),
        ({"addr": {"since": "yesterday"}}, "field 'addr': cannot convert"),
        ({"tags": "a"}, "field 'tags': expected list<string>, got a JSON string"),
        ({"tags": [1]}, "field 'tags[0]': expected string, got a JSON number 1"),
        ({"tags": ["a", None, {"b": 1}]}, """field 'tags[2]': expected string, got a JSON object {"b": 1}"""),
        ({"items": [{"price": "123456789.99"}]}, "Decimal value does not fit in precision 10"),
    ],
)
def test_a_nested_value_of_the_wrong_shape_is_a_dead_letter_naming_the_field(
    value: dict[str, Any], reason: str
) -> None:
    decoded = decode([json.dumps({"id": 1}).encode(), json.dumps({"id": 2, **value}).encode()], fields=NESTED)

    assert_exactly_once(decoded, [100, 101])
    assert decoded.dead_letters.column("offset").to_pylist() == [101]
    assert reason in decoded.dead_letters.column("error")[0].as_py()


def test_a_renamed_field_is_read_under_either_name_into_its_new_column() -> None:
    fields = [FieldSpec(name="id", type="long", required=True), FieldSpec(name="quantity", type="int")]
    values: list[bytes | None] = [b'{"id": 1, "quantity": 5}', b'{"id": 2, "qty": 7}', b'{"id": 3}']

    decoded = Decoder(fields, {"qty": "quantity"}).decode(chunk(values))

    assert decoded.rows.select(["id", "quantity"]).to_pylist() == [
        {"id": 1, "quantity": 5},
        {"id": 2, "quantity": 7},
        {"id": 3, "quantity": None},
    ]
    assert decoded.rows.column_names[-2:] == ["id", "quantity"]  # the old name is no column


@pytest.mark.parametrize("megabytes", [5, 20])
def test_a_value_larger_than_a_reader_block_decodes(megabytes: int) -> None:
    """Arrow's JSON reader reads in blocks and refuses a document that straddles two; a large valid
    value is read in a block of its own rather than dead-lettered."""
    fields = [FieldSpec(name="id", type="long", required=True), FieldSpec(name="blob", type="string")]
    big = json.dumps({"id": 10, "blob": "x" * (megabytes << 20)}).encode()
    values: list[bytes | None] = [b'{"id": %d, "blob": "y"}' % i for i in range(20)]
    values[10] = big

    decoded = Decoder(fields).decode(chunk(values))

    assert decoded.dead_letters.num_rows == 0
    assert len(decoded.rows.column("blob")[10].as_py()) == megabytes << 20


# --- poison isolation: a chunk with poison costs about what a good one does -------------------

#: JSON values of every kind, some that Arrow takes for some types and some that it refuses
SAMPLES = [
    "true", "false", "0", "-7", "3000000000", "9223372036854775808", "1.5", "1.0", "1e3", "-0.0",
    '"x"', '""', '"1"', '"1.25"', '"2024-02-30"', '"2024-05-01"', '"2024-05-01T12:00:00Z"', '"12:00:00"',
    "{}", '{"a": 1}', "[]", "[1]", '["a"]', "null",
]  # fmt: skip
KIND_TYPES = ["boolean", "int", "long", "float", "double", "decimal(12, 2)", "string", "binary", "date", "timestamp",
              "timestamptz", "time", "struct<a: long>", "list<string>"]  # fmt: skip


@pytest.mark.parametrize("kind", KIND_TYPES)
def test_a_big_chunk_with_poison_gets_the_verdicts_and_reasons_of_each_record_read_alone(kind: str) -> None:
    # a chunk of one is Arrow's own verdict on the record; a big chunk is screened by JSON kind first
    # (msgspec), which must never dead-letter what Arrow takes, nor word a reason differently
    fields = [FieldSpec(name="id", type="long", required=True), FieldSpec(name="v", type=kind)]
    values = [b'{"id": %d, "v": %s}' % (i, value.encode()) for i, value in enumerate(SAMPLES)]
    values += [b'{"id": 1000}'] * 20  # past the size decoded record by record

    together = decode(values, fields=fields)
    alone = [decode([value], fields=fields, offsets=[100 + i]) for i, value in enumerate(values)]

    assert together.rows.to_pylist() == pa.concat_tables([d.rows for d in alone]).to_pylist()
    together_dead = together.dead_letters.select(["offset", "error"]).to_pylist()
    assert together_dead == pa.concat_tables([d.dead_letters for d in alone]).select(["offset", "error"]).to_pylist()


#: values msgspec cannot parse: some no JSON at all, some Arrow's reader may still take
UNPARSED = [
    b'{"id": 1, "v": }', b'{"id": 2, "v": "x"', b'{"id": 3, "v": "x",}', b"{'id': 4}", b'{"id": 5 "v": 1}',
    b'{"id": 6, "v": NaN}', b'{"id": 7, "v": Infinity}', b'{"id": 8, "v": "a\tb"}', b'{"id": 9, "v": "\xff"}',
    b'{"id": 10, "zz": "\xff\xfe"}', b'{"id": 11, "v": "x"} trailing', b'{"id": 12, "v": 01}', b'{"id": 13, "v": 1.}',
    b'{"id": 14, "v": "x", "id": 15}', b'{"id": 16} {"id": 17}', b'{"id": 18, "v": [1, 2}',
]  # fmt: skip


@pytest.mark.parametrize("kind", ["string", "double", "long"])
def test_values_msgspec_cannot_parse_get_the_verdicts_of_each_read_alone(kind: str) -> None:
    # one that no lenient reading takes as JSON is a dead letter without asking Arrow: it must be one
    # Arrow refuses too, said the same; the others are Arrow's to judge
    fields = [FieldSpec(name="id", type="long", required=True), FieldSpec(name="v", type=kind)]
    values = [*UNPARSED, *([b'{"id": 1000}'] * 20)]

    together = decode(values, fields=fields)
    alone = [decode([value], fields=fields, offsets=[100 + i]) for i, value in enumerate(values)]

    rows = pa.concat_tables([d.rows for d in alone]).to_pylist()
    assert repr(together.rows.to_pylist()) == repr(rows)  # (repr: NaN is no NaN's equal)
    together_dead = together.dead_letters.select(["offset", "error"]).to_pylist()
    assert together_dead == pa.concat_tables([d.dead_letters for d in alone]).select(["offset", "error"]).to_pylist()
    assert together.dead_letters.num_rows >= 8


any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["x", "2024-05-01", "2024-05-01T12:00:00Z", "1.25", "12:00:00"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "id"]), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
NESTED_KINDS = [
    FieldSpec(name="id", type="long", required=True),
    FieldSpec(name="n", type="int"),
    FieldSpec(name="amt", type="decimal(12, 2)"),
    FieldSpec(name="at", type="timestamptz"),
    FieldSpec(name="s", type="string"),
    FieldSpec(name="ok", type="boolean"),
    FieldSpec(name="st", type="struct<a: long, b: list<string>>"),
    FieldSpec(name="l", type="list<struct<a: double>>"),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents=st.lists(
        st.fixed_dictionaries({"id": st.integers(0, 99)}, optional={f.name: any_json for f in NESTED_KINDS[1:]}),
        min_size=17,
        max_size=40,
    )
)
def test_poison_screening_never_changes_a_verdict(documents: list[dict[str, Any]]) -> None:
    values = [json.dumps(d).encode() for d in documents]

    together = decode(values, fields=NESTED_KINDS)
    alone = [decode([value], fields=NESTED_KINDS, offsets=[100 + i]) for i, value in enumerate(values)]

    assert together.rows.to_pylist() == pa.concat_tables([d.rows for d in alone]).to_pylist()
    assert together.dead_letters.select(["offset", "error"]).to_pylist() == (
        pa.concat_tables([d.dead_letters for d in alone]).select(["offset", "error"]).to_pylist()
    )


def test_a_chunk_with_drifted_types_is_read_by_arrow_a_few_times_not_once_per_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Arrow's reader costs ~0.2 ms a call whatever the size: bisecting down to each poison record
    # made a batch of drifted types ~500x slower than a good one
    import ingest.formats.json as json_format

    reads: list[int] = []
    real = json_format._read

    def counted(payload: bytes, block_size: int, options: Any) -> pa.Table:
        reads.append(1)
        return real(payload, block_size, options)

    monkeypatch.setattr(json_format, "_read", counted)
    values = [good(i, x=str(i)) if i % 10 == 0 else good(i) for i in range(1000)]  # 10% poison

    decoded = decode(values)

    assert_exactly_once(decoded, list(range(100, 1100)))
    assert decoded.dead_letters.num_rows == 100
    assert decoded.dead_letters.column("error")[0].as_py() == """field 'x': expected double, got a JSON string "0\""""
    assert len(reads) <= 2  # the whole chunk, then the good records as one block


@pytest.mark.parametrize("size", [1, 30], ids=["alone", "in-a-big-chunk"])
def test_a_byte_order_mark_before_the_object_is_skipped_as_rfc_8259_allows(size: int) -> None:
    # it was a dead letter with an empty reason
    bom = b"\xef\xbb\xbf"
    values = [bom + good(0), bom, bom + b'"x"'] + [good(i) for i in range(1, size)]

    decoded = decode(values)

    assert decoded.rows.column("id").to_pylist() == list(range(size))
    assert decoded.dead_letters.column("error").to_pylist() == [
        "value is empty; expected a JSON object",
        "JSON value is not an object (got str)",
    ]


def test_a_value_over_max_value_bytes_is_a_dead_letter_saying_so_whatever_the_format() -> None:
    from ingest.formats.rows import SizeLimited

    too_long = good(1, s="x" * 200)
    values = [good(0), too_long, None, good(3)]
    limited = SizeLimited(Decoder(FIELDS), max_bytes=100)

    decoded = limited.decode(chunk(values))

    assert sorted(decoded.dead_letters.column("offset").to_pylist()) == [101, 102]
    assert decoded.rows.column("id").to_pylist() == [0, 3]
    reasons = dict(
        zip(
            decoded.dead_letters.column("offset").to_pylist(),
            decoded.dead_letters.column("error").to_pylist(),
            strict=True,
        )
    )
    assert (
        reasons[101]
        == f"value is {len(too_long)} bytes, over dead_letters.max_value_bytes (100); raise it to take such records"
    )
    assert reasons[102].startswith("value is null")


# --- fields the table does not declare (unknown_fields) ---------------------------------------

WITH_EXTRA: list[Declared] = [*FIELDS[:2], Field(EXTRA_COLUMN, "string"), *FIELDS[2:]]


def _unknown_values(size: int, poison: bool) -> list[bytes | None]:
    values: list[bytes | None] = [good(i) for i in range(size)]
    values[1] = good(1, color="red", tags=[1, 2])
    values[3] = good(3, note=None)  # a null is no value: not counted
    values[4] = b'{"id": 4, "x": NaN, "zz": {"deep": true}}'  # msgspec refuses NaN; Arrow takes it
    if poison:
        values[2] = good(2, x="drifted", color="blue")  # a dead letter for its type: not counted
        values[5] = None
    return values


@pytest.mark.parametrize("poison", [False, True], ids=["clean", "with-poison"])
@pytest.mark.parametrize("size", [8, 40], ids=["one-by-one", "whole-chunk"])
def test_unknown_fields_are_counted_captured_or_dead_lettered(size: int, poison: bool) -> None:
    values = _unknown_values(size, poison)

    dropped = Decoder(FIELDS, None, "drop").decode(chunk(values))
    captured = Decoder(WITH_EXTRA, None, "capture").decode(chunk(values))
    refused = Decoder(FIELDS, None, "dead_letter").decode(chunk(values))

    assert dropped.unknown == captured.unknown == refused.unknown == 2
    assert dropped.rows.num_rows == captured.rows.num_rows == size - 2 * poison
    assert captured.rows.schema.names[:-7] == [*KAFKA_COLUMNS.names, "id", "n", EXTRA_COLUMN]
    extra = dict(
        zip(captured.rows.column("id").to_pylist(), captured.rows.column(EXTRA_COLUMN).to_pylist(), strict=True)
    )
    assert json.loads(extra[1]) == {"color": "red", "tags": [1, 2]}
    assert json.loads(extra[4]) == {"zz": {"deep": True}}
    assert {i for i, e in extra.items() if e is not None} == {1, 4}
    assert refused.rows.column("id").to_pylist() == [
        i for i in dropped.rows.column("id").to_pylist() if i not in (1, 4)
    ]
    reasons = dict(
        zip(
            refused.dead_letters.column("offset").to_pylist(),
            refused.dead_letters.column("error").to_pylist(),
            strict=True,
        )
    )
    assert (
        reasons[101]
        == "unknown field(s) 'color', 'tags': the table does not declare them (unknown_fields: dead_letter)"
    )
    assert reasons[104].startswith("unknown field(s) 'zz'")
    assert_exactly_once(refused, list(range(100, 100 + size)))


# --- values taken by default, refused by config (refuse:) -------------------------------------

LOSSY = [
    (b'{"id": 1, "x": NaN}', "nan", "field 'x': nan is not a finite number (refuse: nan)"),
    (b'{"id": 2, "f": -Infinity}', "nan", "field 'f': -inf is not a finite number (refuse: nan)"),
    (b'{"id": 3, "at": "2024-05-01T12:00:00"}', "naive_timestamps", "field 'at': '2024-05-01T12:00:00' has no zone"),
    (b'{"id": 4, "at": "2024-05-01"}', "date_only_timestamps", "field 'at': '2024-05-01' is a date without a time"),
]


@pytest.mark.parametrize("size", [6, 40], ids=["one-by-one", "whole-chunk"])
def test_lossy_values_are_taken_by_default_and_dead_letters_when_refused(size: int) -> None:
    from ingest.engines.task_spec import TaskSpec

    values: list[bytes | None] = [good(i) for i in range(size)]
    for value, _, _ in LOSSY:
        values[json.loads(value.replace(b"NaN", b"0").replace(b"-Infinity", b"0"))["id"]] = value
    zoned = [b'{"id": 5, "at": "2024-05-01T12:00:00+02:00"}', b'{"id": 5, "at": "2024-05-01 12:00:00.5Z"}']
    values[5] = zoned[size % 2]  # a zone, however written, is no naive timestamp

    def spec(refuse: tuple[str, ...]) -> TaskSpec:
        fields = tuple(Field(f.name, f.type, f.required, f.doc) for f in FIELDS)
        return TaskSpec({}, ("orders",), "g", 1.0, fields, 1000, refuse=refuse)

    taken = spec(()).decoder().decode(chunk(values))
    refused = spec(("nan", "naive_timestamps", "date_only_timestamps")).decoder().decode(chunk(values))

    assert taken.dead_letters.num_rows == 0
    assert_exactly_once(refused, list(range(100, 100 + size)))
    reasons = dict(
        zip(
            refused.dead_letters.column("offset").to_pylist(),
            refused.dead_letters.column("error").to_pylist(),
            strict=True,
        )
    )
    assert sorted(reasons) == [101, 102, 103, 104]
    for value, _, reason in LOSSY:
        assert reasons[100 + json.loads(value.replace(b"NaN", b"0").replace(b"-Infinity", b"0"))["id"]].startswith(
            reason
        )
    only_dates = spec(("date_only_timestamps",)).decoder().decode(chunk(values))
    assert only_dates.dead_letters.column("offset").to_pylist() == [104]


@pytest.mark.parametrize("size", [3, 40], ids=["one-by-one", "whole-chunk"])
def test_review_cases_of_refused_and_unknown_values_hold_whatever_the_chunk(size: int) -> None:
    # a renamed column's old name is checked too; a date alone has no zone either; an unknown field
    # whose text is not UTF-8 is named, not missed, in a big chunk as in a small one
    renamed = Decoder(FIELDS, {"when": "at"}, "drop", frozenset({"naive_timestamps"}))
    values: list[bytes | None] = [good(i) for i in range(size)]
    values[1] = b'{"id": 1, "when": "2024-05-01"}'
    values[2] = b'{"id": 2, "at": "2024-05-01T10:00:00Z"}'

    decoded = renamed.decode(chunk(values))

    assert decoded.dead_letters.column("error").to_pylist() == [
        "field 'when': '2024-05-01' has no zone offset (refuse: naive_timestamps)"
    ]
    values[1] = b'{"id": 1, "odd": "\xff"}'
    refused = Decoder(FIELDS, None, "dead_letter").decode(chunk(values))
    assert refused.dead_letters.column("error").to_pylist() == [
        "unknown field(s) 'odd': the table does not declare them (unknown_fields: dead_letter)"
    ]


#: the decoder's rows of the bad-input table (docs/usage.md): each value alone, and the error it words
README_ROWS = [
    (b"not json", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b"[1,2]", "JSON value is not an object (got list)"),
    (None, "value is null (a tombstone); expected a JSON object"),
    (b"", "value is empty; expected a JSON object"),
    (b'{"amount": 1.5}', "required field(s) 'id' missing or null"),
    (b'{"id": 1, "amount": "12.50"}', "field 'amount': expected double, got a JSON string \"12.50\""),
    (b'{"id": 1, "tags": [1]}', "field 'tags[0]': expected string, got a JSON number 1"),
    (b'{"id": 99999999999999999999}', "field 'id': cannot convert 99999999999999999999 to long: "),
    (b'{"id": 1, "x": 3}', "unknown field(s) 'x': the table does not declare them (unknown_fields: dead_letter)"),
    (
        b'{"id": 1, "ts": "2026-12-01T10:00:00"}',
        "field 'ts': '2026-12-01T10:00:00' has no zone offset (refuse: naive_timestamps)",
    ),
    (b'{"id": 1, "ts": "2026-12-01"}', "field 'ts': '2026-12-01' is a date without a time"),
]


@pytest.mark.parametrize(("value", "error"), README_ROWS)
def test_the_readme_bad_input_table_words_what_the_decoder_says(value: bytes | None, error: str) -> None:
    fields = [
        Field("id", "long", True),
        Field("amount", "double", False),
        Field("ts", "timestamptz", False),
        Field("tags", "list<string>", False),
    ]
    refused = frozenset({"naive_timestamps", "date_only_timestamps"})
    decoder = Decoder(fields, unknown_fields="dead_letter", refuse=refused)

    decoded = decoder.decode(chunk([b'{"id": 7}', value, b'{"id": 8}']))

    assert decoded.rows.column("id").to_pylist() == [7, 8]
    (said,) = decoded.dead_letters.column("error").to_pylist()
    assert said.startswith(error)
