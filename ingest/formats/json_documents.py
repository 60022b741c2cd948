"""JSON values parsed one at a time as documents, in C (msgspec, ~0.6 µs a record): what the JSON
decoder judges beside Arrow's reader. Where a chunk holds poison, each value is parsed once and
those whose JSON kinds Arrow refuses for their fields are named here (:meth:`DocumentChecks.sort`),
so Arrow reads the rest as one block; and what Arrow does not read of a value is read here: the
fields the table does not declare, and a timestamp's text (``refuse:``)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from ingest.formats.json_kinds import Kind

#: a timestamp's text that is a date alone; one that ends in a zone (``Z``, ``+02:00``, ``-0530``)
_DATE_ONLY = re.compile(r"\s*\d{4}-\d{2}-\d{2}\s*$")
_ZONED = re.compile(r"(?:[Zz]|[+-]\d{2}(?::?\d{2})?)\s*$")


def document(value: bytes | None) -> dict[str, object] | None:
    """``value`` parsed, if it is one JSON object (msgspec; Python's parser for what msgspec refuses
    and Arrow may take: NaN, a byte order mark)."""
    if not value:
        return None
    try:
        parsed = msgspec.json.decode(value)
    except msgspec.DecodeError:
        try:  # invalid UTF-8 in a string Arrow does not read (an unknown field's) reads as U+FFFD
            parsed = json.loads(value.decode("utf-8", errors="replace").strip().removeprefix("\ufeff"))
        except ValueError:
            return None
    return parsed if isinstance(parsed, dict) else None


def encode(extra: dict[str, object] | None) -> str | None:
    return None if extra is None else msgspec.json.encode(extra).decode()


@dataclass(frozen=True)
class DocumentChecks:
    """What is judged of a table's values parsed as documents (built once per decoder)."""

    #: each parsed name with the kinds its values must be (a renamed column's old name too)
    kinds: Sequence[tuple[str, Kind]]
    #: the names Arrow reads; any other is a field the table does not declare
    known: frozenset[str]
    #: timestamp columns by parsed name, and whether the column has a zone (timestamptz)
    stamps: Sequence[tuple[str, bool]] = ()
    #: ``naive_timestamps``, ``date_only_timestamps``: timestamp text refused (``refuse:``)
    refuse: frozenset[str] = frozenset()

    def kind_error(self, parsed: dict[str, object]) -> str | None:
        """Why Arrow refuses a field of ``parsed`` by its JSON kind alone, naming it; None if none."""
        for name, kind in self.kinds:
            if (value := parsed.get(name)) is not None and (error := kind.error(value, name)):
                return error
        return None

    def sort(
        self, candidates: list[bytes], index: Sequence[int], bad: dict[int, str], unknown: set[int]
    ) -> tuple[list[bytes], list[int], list[int]]:
        """Each of ``candidates`` (``index``: their positions in the chunk) parsed once: one whose
        JSON kinds Arrow refuses goes to ``bad`` with the field named, one with fields the table
        does not declare to ``unknown``. Returned: the others with their positions, for Arrow to read
        as one block, and (by place in ``candidates``) those msgspec could not parse, for Arrow to
        judge one at a time: its verdict is the one that counts."""
        decode, known = msgspec.json.decode, self.known
        kept: list[bytes] = []
        kept_index: list[int] = []
        alone: list[int] = []
        for k, value in enumerate(candidates):
            try:
                parsed = decode(value)
            except msgspec.DecodeError:
                alone.append(k)
                continue
            error = self.kind_error(parsed) if isinstance(parsed, dict) else None
            if error is None:
                kept.append(value)
                kept_index.append(index[k])
                if isinstance(parsed, dict) and any(v is not None for key, v in parsed.items() if key not in known):
                    unknown.add(index[k])
            else:
                bad[index[k]] = error
        return kept, kept_index, alone

    def extra_of(self, value: bytes | None) -> dict[str, object] | None:
        """The fields of the JSON object ``value`` the table does not declare (None: none, or not an object)."""
        parsed = document(value)
        if parsed is None:
            return None
        extra = {k: v for k, v in parsed.items() if k not in self.known and v is not None}
        return extra or None

    def lossy_timestamp(self, value: bytes | None) -> str | None:
        """Why ``value``'s timestamp text is refused (``refuse:``): a date alone, or no zone; None if it is not."""
        parsed = document(value) or {}
        for name, zoned in self.stamps:
            text = parsed.get(name)
            if not isinstance(text, str):
                continue
            date_only = _DATE_ONLY.match(text) is not None
            if date_only and "date_only_timestamps" in self.refuse:
                return f"field {name!r}: {text!r} is a date without a time (refuse: date_only_timestamps)"
            if zoned and "naive_timestamps" in self.refuse and (date_only or not _ZONED.search(text)):
                return f"field {name!r}: {text!r} has no zone offset (refuse: naive_timestamps)"
        return None
