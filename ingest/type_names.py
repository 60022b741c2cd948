"""Iceberg's type names (``schema:``'s ``long``, ``decimal(10,2)``, ``struct<a: int>``, ...) as the
Arrow types the pipeline writes, and back."""

from __future__ import annotations

import difflib
import functools
import re

import pyarrow as pa

#: a field name inside a declared ``struct<…>`` (as for top-level fields)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)|(?P<punct>[<>(),:]))")

_ARROW_TYPES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "binary": pa.binary(),
    "time": pa.time64("us"),
}


#: the primitive type names ``schema:`` accepts
PRIMITIVE_TYPES = frozenset(_ARROW_TYPES)


class _TypeParser:
    """Iceberg's type strings, as Arrow types: the primitives, ``decimal(P,S)``,
    ``struct<name: type, …>``, ``list<type>`` and ``map<key type, value type>``. Nested fields,
    list elements and map values are optional (nullable); map keys are required."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        position = 0
        while position < len(text.rstrip()):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                raise ValueError(f"unexpected {text[position:].strip()[:20]!r} in type {text!r}")
            self.tokens.append(match.group(match.lastgroup or "word"))
            position = match.end()
        self.at = 0

    def parse(self) -> pa.DataType:
        result = self._type()
        if self.at != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.at]!r} after the type in {self.text!r}")
        return result

    def _next(self, expected: str | None = None) -> str:
        if self.at >= len(self.tokens):
            raise ValueError(f"type {self.text!r} ends early" + (f"; expected {expected!r}" if expected else ""))
        token = self.tokens[self.at]
        self.at += 1
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r} but found {token!r} in type {self.text!r}")
        return token

    def _type(self) -> pa.DataType:
        word = self._next().lower()
        if word in _ARROW_TYPES:
            return _ARROW_TYPES[word]
        if word == "decimal":
            self._next("(")
            precision = int(self._next())
            self._next(",")
            scale = int(self._next())
            self._next(")")
            if not 1 <= precision <= 38 or scale > precision:
                raise ValueError(f"{self.text!r}: decimal precision must be 1 to 38 and scale at most the precision")
            return pa.decimal128(precision, scale)
        if word == "list":
            self._next("<")
            element = self._type()
            self._next(">")
            return pa.list_(pa.field("element", element))
        if word == "map":
            self._next("<")
            key = self._type()
            self._next(",")
            value = self._type()
            self._next(">")
            return pa.map_(pa.field("key", key, nullable=False), pa.field("value", value))
        if word == "struct":
            self._next("<")
            fields: list[pa.Field] = []
            while True:
                name = self._next()
                if not _NAME.fullmatch(name) or name in {f.name for f in fields}:
                    raise ValueError(f"{name!r} is not a field name, or appears twice, in type {self.text!r}")
                self._next(":")
                fields.append(pa.field(name, self._type()))
                if self._next() == ">":
                    return pa.struct(fields)
                self.at -= 1
                self._next(",")
        close = difflib.get_close_matches(word, [*_ARROW_TYPES, "decimal", "list", "map", "struct"], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"unknown Iceberg type {word!r} in {self.text!r}; {hint}use boolean, int, long, float, double, "
            "decimal(P,S), date, time, timestamp, timestamptz, string, binary, struct<name: type, ...>, list<type>, "
            "or (not for JSON values) map<key, value>"
        )


@functools.lru_cache(maxsize=256)
def arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type a declared type name is stored as (raises ValueError if it is none)."""
    try:
        return _TypeParser(type_name).parse()
    except ValueError as error:
        if str(error).startswith("unknown Iceberg type"):
            raise
        raise ValueError(f"unknown Iceberg type {type_name!r}: {error}") from None


def type_name(arrow: pa.DataType) -> str:
    """The canonical declared name of an Arrow type :func:`arrow_type` gives."""
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_struct(arrow):
        return "struct<" + ", ".join(f"{f.name}: {type_name(f.type)}" for f in arrow) + ">"
    if pa.types.is_map(arrow):
        return f"map<{type_name(arrow.key_type)}, {type_name(arrow.item_type)}>"
    if pa.types.is_list(arrow):
        return f"list<{type_name(arrow.value_type)}>"
    return next(name for name, known in _ARROW_TYPES.items() if known == arrow)
