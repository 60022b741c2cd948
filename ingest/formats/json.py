"""Vectorised decoding of Kafka JSON values into Arrow, with poison records split off.

The fast path parses a whole chunk of values with Arrow's JSON reader against the declared
schema. Good chunks (the usual case) are parsed once, in C++. When a chunk holds bad records the
reader rejects the whole block; then every value is parsed once by msgspec (C, ~0.6 µs a record)
and those whose JSON kinds Arrow refuses for their fields whatever the value (a string for a
``double``: the usual drift) go straight to the dead letters, named. Arrow then reads the rest as
one block again, and is still the judge of everything else: anything it refuses there is bisected
until each bad record stands alone, and a value msgspec cannot parse is tried on its own.

What Arrow's reader takes into a field of each type is :mod:`ingest.formats.json_kinds`'s; the
values parsed one at a time (msgspec), and what is judged of them beside Arrow, are
:mod:`ingest.formats.json_documents`'.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ingest.formats.json_documents import DocumentChecks, encode
from ingest.formats.json_kinds import JSON_KINDS, Kind, nested, parse_type
from ingest.formats.rows import assemble, dead_letters
from ingest.records import EXTRA_COLUMN, Declared, Decoded, Field, RawChunk, rows_schema
from ingest.type_names import arrow_type

#: below this many records a failing slice is parsed one record at a time
_SINGLES = 16


_NEWLINE, _BRACE = ord("\n"), ord("{")
_BOM = b"\xef\xbb\xbf"
#: the bytes of printable ASCII: a value of only these reads the same to a lenient parser as to a strict one
_PRINTABLE = bytes(range(0x20, 0x7F))


class _Bad(Exception):
    pass


def _one_object_per_line(values: list[bytes | None]) -> bytes | None:
    """The values joined by newlines when each is one line that starts like a JSON object (the
    usual chunk), else None. Newlines are found with numpy, which releases the GIL: the same
    checks with ``bytes.count`` held it for ~15% of a worker's time, stalling its Kafka reader.
    ``all()`` (a tombstone or an empty value is falsy) and ``in`` (memchr) hold it briefly."""
    if not values or not all(values):
        return None
    payload = b"\n".join(values)  # type: ignore[arg-type]
    if payload[:1] != b"{" or payload[-1:] == b"\n" or b"\r" in payload:
        return None
    data = np.frombuffer(payload, np.uint8)
    breaks = np.flatnonzero(data == _NEWLINE)
    if len(breaks) != len(values) - 1:
        return None  # a value spans lines: Arrow would read it as several records
    # each line starts like an object: every newline is followed by a brace (none ends the payload)
    return payload if bool((data[breaks + 1] == _BRACE).all()) else None


def _read(payload: bytes, block_size: int, options: pj.ParseOptions) -> pa.Table:
    """Arrow's JSON reader over ``payload``, in blocks of ``block_size`` bytes (a document must fit one);
    threads only for several blocks (for one, starting them is most of the cost of a small read)."""
    read = pj.ReadOptions(block_size=block_size, use_threads=len(payload) > block_size)
    return pj.read_json(pa.py_buffer(payload), read_options=read, parse_options=options)


class Decoder:
    """Decodes :class:`RawChunk` values against the declared fields."""

    def __init__(
        self,
        fields: Sequence[Declared],
        renames: Mapping[str, str] | None = None,
        unknown_fields: str = "drop",
        refuse: frozenset[str] = frozenset(),
    ) -> None:
        #: the fields read from the values (``_extra`` is filled here, with ``unknown_fields: capture``)
        self.fields = [f for f in fields if f.name != EXTRA_COLUMN]
        self._extra_at = next((i for i, f in enumerate(fields) if f.name == EXTRA_COLUMN), None)
        self._unknown_fields = unknown_fields
        names = {f.name for f in self.fields}
        #: a renamed column's old name, read too: records of either name land in the column
        self._old = {new: old for old, new in (renames or {}).items() if new in names and old not in names}
        parsed = [(f.name, f.type) for f in self.fields] + [
            (self._old[f.name], f.type) for f in self.fields if f.name in self._old
        ]
        self._parse_schema = pa.schema([pa.field(name, parse_type(arrow_type(kind))) for name, kind in parsed])
        self._options = pj.ParseOptions(explicit_schema=self._parse_schema, unexpected_field_behavior="ignore")
        #: the fast path's: fields the table does not declare come out as columns of their own,
        #: which tell which records have them (as fast as ignoring them)
        self._inferring = pj.ParseOptions(explicit_schema=self._parse_schema, unexpected_field_behavior="infer")
        known = frozenset(self._parse_schema.names)
        self._schema = rows_schema(fields)
        self._field_schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in self.fields])
        kinds = [(name, kind) for name, declared in parsed if (kind := Kind.of(arrow_type(declared)))]
        stamps = [
            (name, t.tz is not None)
            for f in self.fields
            if pa.types.is_timestamp(t := arrow_type(f.type))
            for name in (f.name, *([self._old[f.name]] if f.name in self._old else []))
        ]
        #: what is judged of values parsed one at a time: kinds, undeclared fields, timestamp text
        self._checks = DocumentChecks(kinds, known, stamps, refuse & {"naive_timestamps", "date_only_timestamps"})
        self._probes: dict[str, Decoder] = {}  # one field's decoder, built once, to name what Arrow refused
        #: the last chunk held poison: Arrow's read of the whole next one, likely refused, is skipped
        self._poisoned = False

    def decode(self, chunk: RawChunk) -> Decoded:
        values = chunk.values
        bad: dict[int, str] = {}
        payload = _one_object_per_line(values)
        if payload is not None:
            candidates: list[bytes] = values  # type: ignore[assignment]
            index: Sequence[int] = range(len(values))
        else:
            candidates, index = self._screen(values, bad)
            payload = b"\n".join(candidates)
            if payload.count(b"\n") != len(candidates) - 1 or b"\r" in payload:
                candidates, index = self._normalise_line_breaks(candidates, list(index), bad)
                payload = None
        parts: list[tuple[Sequence[int], pa.Table]] = []
        unknown: set[int] = set()  # positions of the records with fields the table does not declare
        if len(candidates) > _SINGLES and self._poisoned:  # so was the last chunk: this one likely is too
            self._poisoned = self._isolate(candidates, index, parts, bad, unknown)
        elif len(candidates) > _SINGLES:
            try:
                found: list[int] = []
                self._keep(self._try(candidates, 0, len(candidates), payload, found), index, parts, bad)
                unknown.update(index[k] for k in found)
            except _Bad:
                self._poisoned = self._isolate(candidates, index, parts, bad, unknown)
        else:
            self._parse(candidates, index, 0, len(candidates), parts, bad, payload)
            unknown.update(i for indices, _ in parts for i in indices if self._checks.extra_of(values[i]))
        if len(parts) == 1 and len(parts[0][0]) == len(values):
            good: Sequence[int] | None = None  # every record decoded: no gather needed
        else:
            good = [i for indices, _ in parts for i in indices]
        fields = pa.concat_tables([t for _, t in parts]).combine_chunks() if parts else self._field_schema.empty_table()
        if good is not None and bool((np.diff(np.asarray(good)) < 0).any()):
            order = np.argsort(np.asarray(good), kind="stable")  # a value tried on its own: back in offset order
            fields = fields.take(pa.array(order))
            good = [good[i] for i in order]
        positions: Sequence[int] = range(len(values)) if good is None else good
        unknown.intersection_update(positions)  # a dead letter for another reason is not counted
        if unknown and self._unknown_fields == "dead_letter":
            for i in unknown:
                names = ", ".join(map(repr, sorted(self._checks.extra_of(values[i]) or {})[:5]))
                bad[i] = f"unknown field(s) {names}: the table does not declare them (unknown_fields: dead_letter)"
            fields = fields.filter(pa.array([i not in unknown for i in positions]))
            good = positions = [i for i in positions if i not in unknown]
        if self._checks.refuse and self._checks.stamps:
            refused = {i: why for i in positions if (why := self._checks.lossy_timestamp(values[i]))}
            if refused:
                bad.update(refused)
                fields = fields.filter(pa.array([i not in refused for i in positions]))
                good = positions = [i for i in positions if i not in refused]
        if self._extra_at is not None:
            captured = unknown if self._unknown_fields == "capture" else set()
            extra = pa.array(
                [encode(self._checks.extra_of(values[i])) if i in captured else None for i in positions], pa.string()
            )
            fields = fields.add_column(self._extra_at, pa.field(EXTRA_COLUMN, pa.string()), extra)
        rows = assemble(chunk, good, fields, self._schema)
        return Decoded(rows=rows, dead_letters=dead_letters(chunk, bad), unknown=len(unknown))

    def _isolate(
        self,
        candidates: list[bytes],
        index: Sequence[int],
        parts: list[tuple[Sequence[int], pa.Table]],
        bad: dict[int, str],
        unknown: set[int],
    ) -> bool:
        """Decode a chunk Arrow refused as a whole (it holds poison) at about the cost of a good one;
        whether it did hold any (a chunk after a poisoned one comes here without Arrow's refusal).

        Each value is validated by msgspec once, in C; one whose JSON kinds Arrow refuses goes to
        ``bad`` with the field named. Arrow reads the others as one block (bisecting only around what it
        still refuses), and tries each value msgspec could not parse on its own, unless no lenient
        reading takes it as JSON at all: Arrow's verdict is the one that counts, so no record Arrow
        would take is ever dead-lettered here.
        """
        before = len(bad)
        kept, kept_index, alone = self._checks.sort(candidates, index, bad)
        try:  # the usual case: the rest read as one block, its undeclared fields found as the fast path finds them
            found: list[int] = []
            if kept:
                self._keep(self._try(kept, 0, len(kept), None, found), kept_index, parts, bad)
            unknown.update(kept_index[k] for k in found)
        except _Bad:
            self._parse(kept, kept_index, 0, len(kept), parts, bad)
            unknown.update(i for k, i in enumerate(kept_index) if self._checks.extra_of(kept[k]))
        for k in alone:
            value = candidates[k]
            complaint = self._checks.unreadable(value)
            if complaint is not None:  # no JSON at all: said as Arrow's refusal would be (_explain)
                # ASCII with no control character reads the same leniently: the complaint is _explain's
                plain = value.isascii() and not value.translate(None, _PRINTABLE)
                bad[index[k]] = f"not valid JSON: {complaint}" if plain else self._explain(value, "")
                continue
            self._parse(candidates, index, k, k + 1, parts, bad)
            if self._checks.extra_of(candidates[k]):
                unknown.add(index[k])
        return len(bad) > before

    def _screen(self, values: list[bytes | None], bad: dict[int, str]) -> tuple[list[bytes], Sequence[int]]:
        """The values Arrow's reader may see: those that start like a JSON object.

        Anything else (a tombstone, an empty value, a JSON scalar or array) is classified here:
        Arrow would turn ``null`` into a row of nulls, or crash on a payload that starts with it.
        """
        starts = pc.fill_null(pc.starts_with(pa.array(values, type=pa.binary()), "{"), False)
        if pc.all(starts).as_py():
            return values, range(len(values))  # type: ignore[return-value]
        odd = set(pc.indices_nonzero(pc.invert(starts)).to_pylist())
        candidates: list[bytes] = []
        index: list[int] = []
        for i, value in enumerate(values):
            if i in odd:
                if value is None:
                    bad[i] = "value is null (a tombstone); expected a JSON object"
                    continue
                value = value.lstrip().removeprefix(_BOM).lstrip()  # a BOM is no data: RFC 8259 lets parsers skip it
                if not value.startswith(b"{"):
                    bad[i] = self._explain(value, "")
                    continue
            candidates.append(value)  # type: ignore[arg-type]
            index.append(i)
        return candidates, index

    def _normalise_line_breaks(
        self, candidates: list[bytes], index: list[int], bad: dict[int, str]
    ) -> tuple[list[bytes], list[int]]:
        """Arrow reads one document per line: re-serialise the rare value that spans lines."""
        kept_values: list[bytes] = []
        kept_index: list[int] = []
        for value, i in zip(candidates, index, strict=True):
            if b"\n" in value or b"\r" in value:
                try:
                    value = json.dumps(json.loads(value), separators=(",", ":")).encode()
                except (ValueError, UnicodeDecodeError) as error:
                    bad[i] = f"not valid JSON: {error}"
                    continue
            kept_values.append(value)
            kept_index.append(i)
        return kept_values, kept_index

    def _try(
        self, candidates: list[bytes], lo: int, hi: int, payload: bytes | None = None, unknown: list[int] | None = None
    ) -> pa.Table:
        """``candidates[lo:hi]`` read by Arrow; with ``unknown``, the positions (from ``lo``) of the
        records with fields the table does not declare are added to it."""
        if payload is None:
            payload = b"\n".join(candidates[lo:hi])
        options = self._options if unknown is None else self._inferring
        try:
            table = _read(payload, max(1 << 20, len(payload) // 4 + 1), options)
        except pa.ArrowInvalid as error:
            if "straddl" not in str(error):
                raise _Bad(str(error)) from None
            try:  # a value longer than a block (a 5 MB document): read the payload as one block
                table = _read(payload, len(payload) + 1, options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as again:
                raise _Bad(str(again)) from None
        except pa.ArrowNotImplementedError as error:
            raise _Bad(str(error)) from None
        if table.num_rows != hi - lo:
            raise _Bad(f"value holds {table.num_rows} JSON documents; expected one object")
        if unknown is not None and table.num_columns > len(self._checks.known):
            extra = [table.column(name).is_valid() for name in table.column_names if name not in self._checks.known]
            unknown.extend(np.flatnonzero(functools.reduce(pc.or_, extra).to_numpy(zero_copy_only=False)).tolist())
        return self._finish(table)

    def _finish(self, table: pa.Table) -> pa.Table:
        columns = []
        for spec in self.fields:
            column = table.column(spec.name)
            if spec.name in self._old:
                column = pc.coalesce(column, table.column(self._old[spec.name]))
            target = arrow_type(spec.type)
            try:
                if column.type != target:
                    converted = pc.cast(column, target)
                    if (
                        spec.type == "float"
                        and pc.any(pc.and_(pc.is_inf(converted), pc.invert(pc.is_inf(column)))).as_py()
                    ):
                        raise _Bad(f"field {spec.name!r}: value out of range for float")
                    column = converted
                if pa.types.is_string(target) or nested(target):
                    column.validate(full=True)  # the reader does not check UTF-8 inside strings
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise _Bad(f"field {spec.name!r}: cannot convert to {spec.type}: {error}") from None
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._field_schema)

    def _parse(
        self,
        candidates: list[bytes],
        index: Sequence[int],
        lo: int,
        hi: int,
        parts: list[tuple[Sequence[int], pa.Table]],
        bad: dict[int, str],
        payload: bytes | None = None,
    ) -> None:
        """Parse ``candidates[lo:hi]`` into ``parts`` (in order), bisecting around failing records.

        ``index[k]`` is the position in the chunk of ``candidates[k]``.
        """
        if hi <= lo:
            return
        if hi - lo <= _SINGLES:
            for k in range(lo, hi):
                try:
                    self._keep(self._try(candidates, k, k + 1), index[k : k + 1], parts, bad)
                except _Bad as error:
                    bad[index[k]] = self._explain(candidates[k], str(error))
            return
        try:
            table = self._try(candidates, lo, hi, payload)
        except _Bad:
            middle = (lo + hi) // 2
            self._parse(candidates, index, lo, middle, parts, bad)
            self._parse(candidates, index, middle, hi, parts, bad)
            return
        self._keep(table, index[lo:hi], parts, bad)

    def _keep(
        self,
        table: pa.Table,
        indices: Sequence[int],
        parts: list[tuple[Sequence[int], pa.Table]],
        bad: dict[int, str],
    ) -> None:
        """Split off rows with nulls in required fields; keep the rest."""
        nulls = [
            (spec.name, pc.is_null(table.column(spec.name)).to_numpy(zero_copy_only=False))
            for spec in self.fields
            if spec.required and table.column(spec.name).null_count
        ]
        if nulls:
            missing = functools.reduce(np.logical_or, [flags for _, flags in nulls])
            at = np.asarray(indices)
            if len(nulls) == 1:  # the usual case: one reason for every row
                reason = f"required field(s) {nulls[0][0]!r} missing or null"
                bad.update(dict.fromkeys(at[missing].tolist(), reason))
            else:
                for row in np.flatnonzero(missing).tolist():
                    names = ", ".join(repr(name) for name, flags in nulls if flags[row])
                    bad[int(at[row])] = f"required field(s) {names} missing or null"
            table = table.filter(pa.array(~missing))
            indices = at[~missing].tolist()
        if len(indices):
            parts.append((indices, table))

    def _explain(self, value: bytes | None, arrow_message: str) -> str:
        if not (value or b"").strip():
            return "value is empty; expected a JSON object"
        try:
            document = json.loads(value or b"")
        except (ValueError, UnicodeDecodeError) as error:
            return f"not valid JSON: {error}"
        if not isinstance(document, dict):
            return f"JSON value is not an object (got {type(document).__name__})"
        if arrow_message.startswith("field "):
            return arrow_message  # already names the field
        if reason := self._checks.kind_error(document):
            return reason  # as a big chunk's poison is named (_isolate)
        for spec in self.fields:  # find the field Arrow refused: parse each one on its own
            if spec.name not in document:
                continue
            probe = self._probes.get(spec.name)
            if probe is None:
                probe = self._probes[spec.name] = Decoder([Field(spec.name, spec.type)])
            line = json.dumps({spec.name: document[spec.name]}).encode()
            try:
                probe._finish(_read(line, len(line) + 1, probe._options))
            except _Bad as error:
                return str(error)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                got = json.dumps(document[spec.name])[:80]
                if "changed from" in str(error):
                    kind = JSON_KINDS.get(type(document[spec.name]), "value")
                    return f"field {spec.name!r}: expected {spec.type}, got a JSON {kind} {got}"
                reason = str(error).removeprefix("JSON parse error: ")
                return f"field {spec.name!r}: cannot convert {got} to {spec.type}: {reason}"
        return arrow_message or "Arrow's JSON reader refused the value without a reason"
