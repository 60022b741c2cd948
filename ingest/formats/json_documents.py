"""JSON values parsed one at a time as documents, in C (msgspec, ~0.6 µs a record): what the JSON
decoder judges beside Arrow's reader. Where a chunk holds poison, each value is validated once
against the JSON kinds Arrow takes for its fields, in C (a msgspec type built from them), and
those it refuses are named here (:meth:`DocumentChecks.sort`), so Arrow reads the rest as one
block; and what Arrow does not read of a value is read here: the fields the table does not
declare, and a timestamp's text (``refuse:``)."""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


def _kind_type(kind: Kind) -> Any:
    """The msgspec type a value of ``kind`` decodes as (null always allowed): what it accepts, with
    a struct's judged fields and a list's items as types of their own."""
    if kind.children:
        judged: Any = _struct(kind.children)
    elif kind.item is not None:
        judged = list[_kind_type(kind.item)]  # type: ignore[misc]
    else:
        accepted = [float if t is int and float in kind.accepted else t for t in kind.accepted]
        judged = functools.reduce(operator.or_, dict.fromkeys(accepted))
    return judged | None


def _struct(kinds: Sequence[tuple[str, Kind]]) -> Any:
    """A msgspec Struct of ``kinds``' fields, each optional; other fields are ignored (their names
    need not be identifiers: they are renamed)."""
    fields = [(f"f{i}", _kind_type(kind), None) for i, (_, kind) in enumerate(kinds)]
    return msgspec.defstruct("Judged", fields, rename={f"f{i}": name for i, (name, _) in enumerate(kinds)})


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
    #: a value validated against :attr:`kinds` in C: the fast screen of :meth:`sort`
    _judged: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_judged", msgspec.json.Decoder(_struct(self.kinds)))

    def kind_error(self, parsed: dict[str, object]) -> str | None:
        """Why Arrow refuses a field of ``parsed`` by its JSON kind alone, naming it; None if none."""
        for name, kind in self.kinds:
            if (value := parsed.get(name)) is not None and (error := kind.error(value, name)):
                return error
        return None

    def sort(
        self, candidates: list[bytes], index: Sequence[int], bad: dict[int, str]
    ) -> tuple[list[bytes], list[int], list[int]]:
        """Each of ``candidates`` (``index``: their positions in the chunk) validated once against
        the JSON kinds Arrow takes for its fields, in C; one it refuses is parsed again to name the
        field (:meth:`kind_error`), and goes to ``bad``. Returned: the others with their positions,
        for Arrow to read as one block, and (by place in ``candidates``) those msgspec could not
        parse, for Arrow to judge one at a time: its verdict is the one that counts."""
        judge = self._judged.decode
        kept: list[bytes] = []
        kept_index: list[int] = []
        alone: list[int] = []
        for k, value in enumerate(candidates):
            try:
                judge(value)
            except msgspec.ValidationError:
                try:  # (a kind refused before the end was read: the value may be no JSON still)
                    parsed = msgspec.json.decode(value)
                except msgspec.DecodeError:
                    alone.append(k)
                    continue
                error = self.kind_error(parsed) if isinstance(parsed, dict) else None
                if error is not None:
                    bad[index[k]] = error
                    continue
            except msgspec.DecodeError:
                alone.append(k)
                continue
            kept.append(value)
            kept_index.append(index[k])
        return kept, kept_index, alone

    @staticmethod
    def unreadable(value: bytes) -> str | None:
        """Why ``value`` is no JSON even to the most lenient reading (Python's parser's complaint),
        with invalid UTF-8 replaced and control characters in strings allowed (what msgspec refuses
        and Arrow's reader may still take); None if it reads. Arrow refuses such a value too, so
        asking it is not needed."""
        try:
            json.loads(value.decode("utf-8", errors="replace"), strict=False)
        except ValueError as error:
            return str(error)
        return None

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
