"""Decoding for ``route_by``: each row marked with the table its value names, or a dead letter
saying why it names none (see :mod:`ingest.route_by`)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.config import ROUTE_VALUE_CHARS, PipelineConfig, RouteBySpec
from ingest.errors import ConfigError
from ingest.formats.rows import dead_letters, together
from ingest.ports import ValueDecoder
from ingest.records import ROUTE_COLUMN, ROWS, Decoded, RawChunk
from ingest.route_by.writing import RoutedTables, rows_below


@dataclass(frozen=True)
class Route:
    """What routing needs of ``route_by``, in the form that crosses to workers and executors."""

    spec: RouteBySpec
    #: the pipeline's own tables (its ledger's and its dead letters'): no value may name them
    reserved: frozenset[str]

    @property
    def where(self) -> str:
        """Where a record's value is, in messages."""
        return f"field {self.spec.field!r}" if self.spec.field is not None else f"header {self.spec.header!r}"

    def table_of(self, value: str | None) -> tuple[str | None, str]:
        """The table ``value`` names, or None and why it names none."""
        spec, where = self.spec, self.where
        if value is None or value == "":
            return None, f"route_by: the record has no {where} to pick its table by"
        if spec.allow is not None and value not in spec.allow:
            return None, f"route_by: {where} is {value!r}, not one of route_by.allow {spec.allow}"
        if not ROUTE_VALUE_CHARS.fullmatch(value):
            return None, f"route_by: {where} is {value!r}, which cannot be part of a table name (letters, digits, '_')"
        table = spec.table_of(value)
        if table.lower() in self.reserved:
            return None, f"route_by: {where} is {value!r}, which names {table}, a table of the pipeline's own"
        return table, ""


def route_of(config: PipelineConfig) -> Route | None:
    """The routing of ``config``'s records (``route_by``), or None."""
    if config.route_by is None:
        return None
    return Route(config.route_by, frozenset({config.table.lower(), config.dead_letters.lower()}))


class Routing:
    """The rows ``decoder`` makes, each marked with its table (:data:`ROUTE_COLUMN`); records whose
    value names no table, or a table ``tables`` refuses, as dead letters saying why (but for those
    below a refused table's floor: it holds them)."""

    def __init__(self, decoder: ValueDecoder, route: Route, tables: RoutedTables | None = None) -> None:
        self.decoder = decoder
        self.route = route
        #: the refused tables and the floors, as the batch's files are cut (None: none refused)
        self.tables = tables

    def decode(self, chunk: RawChunk) -> Decoded:
        decoded = self.decoder.decode(chunk)
        rows = decoded.rows
        values = self._values(chunk, rows)
        names, reasons = [], []
        refusing: list[str | None] = []  # per value, the refused table it names
        refused = self.tables.refused if self.tables is not None else {}
        distinct = pc.unique(values).to_pylist()
        for value in distinct:
            table, why = self.route.table_of(value)
            if table is not None and table in refused:
                refusing.append(table)
                why = (
                    f"route_by: {self.route.where} is {value!r}, which names {table}, a table that cannot take the "
                    f"pipeline's rows: {refused[table]} Its records are dead letters until it can; the batches "
                    "read after that write to it."
                )
                table = None
            else:
                refusing.append(None)
            names.append(table)
            reasons.append(why)
        index = pc.index_in(values, value_set=pa.array(distinct, pa.string()), skip_nulls=False)
        tables = pc.take(pa.array(names, pa.string()), index)
        bad = pc.is_null(tables)
        if not pc.any(bad).as_py():
            return Decoded(rows.append_column(ROUTE_COLUMN, tables), decoded.dead_letters, decoded.unknown)
        dead = bad
        if any(refusing):  # a refused table holds what lies below its floor: neither rows nor dead letters
            held = self._held(rows, pc.take(pa.array(refusing, pa.string()), index))
            dead = pc.and_(bad, pc.invert(held)) if held is not None else bad
        why = pc.take(pa.array(reasons, pa.string()), index)
        positions = _positions(chunk, rows)
        set_aside = {positions[row]: why[row].as_py() for row in pc.indices_nonzero(dead).to_pylist()}
        kept = pc.invert(bad)
        rows = rows.filter(kept).append_column(ROUTE_COLUMN, tables.filter(kept))
        return Decoded(rows, together(decoded.dead_letters, dead_letters(chunk, set_aside)), decoded.unknown)

    def _held(self, rows: pa.Table, refusing: pa.Array) -> pa.Array | None:
        """Which of ``rows`` a refused table holds already: routed to it (``refusing`` names it),
        below its floor."""
        assert self.tables is not None
        held = None
        for name in pc.unique(refusing.drop_null()).to_pylist():
            below = rows_below(rows, self.tables.floors.get(name, {}))
            if below is not None:
                here = pc.and_(pc.equal(refusing, name), below)
                held = here if held is None else pc.or_(held, here)
        return None if held is None else pc.fill_null(held, False)

    def _values(self, chunk: RawChunk, rows: pa.Table) -> pa.Array:
        """Each row's route value, as text (null: it has none)."""
        spec = self.route.spec
        if spec.field is not None:
            if spec.field not in rows.column_names:  # (a registry's schema without it)
                raise ConfigError(
                    f"route_by.field: the records have no field {spec.field!r} (the table's columns: "
                    f"{', '.join(rows.column_names)}); route by a field they have, or by a header"
                )
            column = rows.column(spec.field).combine_chunks()
            kind = column.type
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                return column.cast(pa.string())
            if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
                return pc.cast(column, pa.string())
            raise ConfigError(
                f"route_by.field: {spec.field!r} is {kind}; a table is named by text, an integer or a boolean"
            )
        last: list[str | None] = []
        for i in range(len(chunk)):
            value = dict(chunk.headers(i) or []).get(spec.header or "")
            try:
                last.append(value.decode() if value is not None else None)
            except UnicodeDecodeError:
                last.append("\ufffd")  # names no table: a dead letter
        positions = _positions(chunk, rows)
        return pa.array([last[positions[row]] for row in range(rows.num_rows)], pa.string())


def _positions(chunk: RawChunk, rows: pa.Table) -> list[int]:
    """Where each of ``rows`` is in ``chunk`` (decoders keep rows in the chunk's order, some left out)."""
    if rows.num_rows == len(chunk):
        return list(range(len(chunk)))
    where = {
        at: i
        for i, at in enumerate(
            zip(chunk.topic.to_pylist(), chunk.partition.to_pylist(), chunk.offset.to_pylist(), strict=True)
        )
    }
    return [
        where[at]
        for at in zip(
            rows.column(ROWS.topic).to_pylist(),
            rows.column(ROWS.partition).to_pylist(),
            rows.column(ROWS.offset).to_pylist(),
            strict=True,
        )
    ]
