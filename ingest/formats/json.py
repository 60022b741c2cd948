"""Vectorised decoding of Kafka JSON values into Arrow, with poison records split off.

The fast path parses a whole chunk of values with Arrow's JSON reader against the declared
schema. When a chunk holds bad records the reader rejects the whole block, so the chunk is
bisected until each bad record stands alone; it then goes to the dead letters with a message
that says what is wrong. Good chunks (the usual case) are parsed once, in C++.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ingest.config import FieldSpec
from ingest.formats.rows import assemble, dead_letters
from ingest.records import Declared, Decoded, RawChunk, arrow_type, rows_schema

#: below this many records a failing slice is parsed one record at a time
_SINGLES = 16


def _json_type(target: pa.DataType) -> pa.DataType:
    """What Arrow's JSON reader parses a field of ``target`` type as, before the final (checked)
    cast; nested types field by field."""
    if pa.types.is_date(target):
        return pa.string()
    if pa.types.is_float32(target):
        return pa.float64()
    if pa.types.is_decimal(target):
        # the reader checks precision before rescaling; parse wide, then cast with checks
        return pa.decimal128(38, target.scale)
    if pa.types.is_struct(target):
        return pa.struct([field.with_type(_json_type(field.type)) for field in target])
    if pa.types.is_list(target):
        return pa.list_(target.value_field.with_type(_json_type(target.value_type)))
    return target


def _nested(target: pa.DataType) -> bool:
    return bool(pa.types.is_struct(target) or pa.types.is_list(target))


_JSON_KINDS = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object", list: "array"}


_NEWLINE, _BRACE = ord("\n"), ord("{")


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
    """Arrow's JSON reader over ``payload``, in blocks of ``block_size`` bytes (a document must fit one)."""
    read = pj.ReadOptions(block_size=block_size, use_threads=True)
    return pj.read_json(pa.py_buffer(payload), read_options=read, parse_options=options)


class Decoder:
    """Decodes :class:`RawChunk` values against the declared fields."""

    def __init__(self, fields: Sequence[Declared], renames: Mapping[str, str] | None = None) -> None:
        self.fields = list(fields)
        names = {f.name for f in fields}
        #: a renamed column's old name, read too: records of either name land in the column
        self._old = {new: old for old, new in (renames or {}).items() if new in names and old not in names}
        parsed = [(f.name, f.type) for f in fields] + [
            (self._old[f.name], f.type) for f in fields if f.name in self._old
        ]
        self._parse_schema = pa.schema([pa.field(name, _json_type(arrow_type(kind))) for name, kind in parsed])
        self._options = pj.ParseOptions(explicit_schema=self._parse_schema, unexpected_field_behavior="ignore")
        self._schema = rows_schema(fields)
        self._field_schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in fields])

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
        self._parse(candidates, index, 0, len(candidates), parts, bad, payload)
        if len(parts) == 1 and len(parts[0][0]) == len(values):
            good: Sequence[int] | None = None  # every record decoded: no gather needed
        else:
            good = [i for indices, _ in parts for i in indices]
        fields = pa.concat_tables([t for _, t in parts]).combine_chunks() if parts else self._field_schema.empty_table()
        rows = assemble(chunk, good, fields, self._schema)
        return Decoded(rows=rows, dead_letters=dead_letters(chunk, bad))

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
                value = value.lstrip()
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

    def _try(self, candidates: list[bytes], lo: int, hi: int, payload: bytes | None = None) -> pa.Table:
        if payload is None:
            payload = b"\n".join(candidates[lo:hi])
        try:
            table = _read(payload, max(1 << 20, len(payload) // 4 + 1), self._options)
        except pa.ArrowInvalid as error:
            if "straddl" not in str(error):
                raise _Bad(str(error)) from None
            try:  # a value longer than a block (a 5 MB document): read the payload as one block
                table = _read(payload, len(payload) + 1, self._options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as again:
                raise _Bad(str(again)) from None
        except pa.ArrowNotImplementedError as error:
            raise _Bad(str(error)) from None
        if table.num_rows != hi - lo:
            raise _Bad(f"value holds {table.num_rows} JSON documents; expected one object")
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
                if pa.types.is_string(target) or _nested(target):
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
        missing = None
        for spec in self.fields:
            if spec.required:
                nulls = pc.is_null(table.column(spec.name))
                missing = nulls if missing is None else pc.or_(missing, nulls)
        if missing is not None and pc.any(missing).as_py():
            flags = missing.to_pylist()
            for row, flag in enumerate(flags):
                if flag:
                    names = [s.name for s in self.fields if s.required and not table.column(s.name)[row].is_valid]
                    bad[indices[row]] = f"required field(s) {', '.join(map(repr, names))} missing or null"
            table = table.filter(pc.invert(missing))
            indices = [i for i, flag in zip(indices, flags, strict=True) if not flag]
        if indices:
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
        for spec in self.fields:  # find the field Arrow refused: parse each one on its own
            if spec.name not in document:
                continue
            probe = Decoder([FieldSpec(name=spec.name, type=spec.type)])
            line = json.dumps({spec.name: document[spec.name]}).encode()
            try:
                probe._finish(_read(line, len(line) + 1, probe._options))
            except _Bad as error:
                return str(error)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                got = json.dumps(document[spec.name])[:80]
                if "changed from" in str(error):
                    kind = _JSON_KINDS.get(type(document[spec.name]), "value")
                    return f"field {spec.name!r}: expected {spec.type}, got a JSON {kind} {got}"
                reason = str(error).removeprefix("JSON parse error: ")
                return f"field {spec.name!r}: cannot convert {got} to {spec.type}: {reason}"
        return arrow_message
