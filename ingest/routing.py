"""``route_by``: a field's (or a header's) value picks the table each record goes to.

Decoding marks each row with the table its value names (:class:`Routing`, a decoder around the
format's); a record whose value is missing, not allowed, or cannot name a table becomes a dead
letter saying so. Writing splits the rows by that mark into each table's data files
(:class:`RoutedTables`), leaving out the rows a table holds already: those below its *floor*, the
ledger the table's own snapshots carry. Each routed table is committed with its floor moved to the
batch's end before the pipeline's ledger table is (see :meth:`ingest.pipeline.Pipeline._attempt`).
A table no record named before is created by the pipeline when a batch first routes records to it:
the tasks report it missing (:attr:`ingest.ports.Produced.missing`), and the batch is produced again.
A table that exists but cannot take the pipeline's rows (another partition spec, properties or sort
order, a schema it cannot evolve to) is *refused* for the batch (:attr:`RoutedTables.refused`): the
records routed to it are dead letters saying why, but for those below its floor (it holds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, Self

import pyarrow as pa
import pyarrow.compute as pc

from ingest.config import ROUTE_VALUE_CHARS, PipelineConfig, RouteBySpec
from ingest.core.ledger import TopicPartition
from ingest.errors import ConfigError
from ingest.formats.rows import dead_letters, together
from ingest.ports import DataFile, FileWriter, ValueDecoder
from ingest.records import ROUTE_COLUMN, ROWS, Decoded, RawChunk


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
            below = _below(rows, self.tables.floors.get(name, {}))
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


class Detachable(FileWriter, Protocol):
    """A table that writes data files and has write-only copies (:class:`ingest.iceberg.table.IcebergTable`)."""

    def detached(self) -> Self: ...


@dataclass(frozen=True)
class RoutedFile:
    """A data file written for one routed table."""

    table: str
    file: DataFile

    @property
    def file_path(self) -> str:
        return self.file.file_path

    @property
    def record_count(self) -> int:
        return self.file.record_count


@dataclass
class RoutedTables:
    """The tables ``route_by`` names, as one writer: rows go to the table their mark names, but
    for those below its floor (it holds them already), and rows for a table not among ``tables``
    are counted in ``missing`` (a task reports them: :attr:`ingest.ports.Produced.missing`)."""

    #: the tables there are, by name (the pipeline adds those it creates)
    tables: Mapping[str, Detachable]
    #: per table, its floor as the batch being produced read it
    floors: dict[str, Mapping[TopicPartition, int]] = field(default_factory=dict)
    #: tables rows were routed to that are not among ``tables`` (their rows were not written)
    missing: set[str] = field(default_factory=set)
    #: tables that cannot take the pipeline's rows now, by name, and why (the records routed to them
    #: are dead letters: :class:`Routing`); the pipeline decides it before each batch's files are cut
    refused: dict[str, str] = field(default_factory=dict)

    def write(self, data: pa.Table, target_file_bytes: int | None = None) -> list[DataFile]:
        files: list[DataFile] = []
        marks = data.column(ROUTE_COLUMN)
        for name in sorted(pc.unique(marks).to_pylist()):
            part = data.filter(pc.equal(marks, name)).drop_columns([ROUTE_COLUMN])
            table = self.tables.get(name)
            if table is None:
                self.missing.add(name)
                continue
            part = _at_or_above(part, self.floors.get(name, {}))
            files += [RoutedFile(name, f) for f in table.write(part, target_file_bytes)]
        return files

    def detached(self) -> RoutedTables:
        """Write-only copies of the tables, for worker processes and Spark executors."""
        tables = {name: table.detached() for name, table in self.tables.items()}
        return RoutedTables(tables, dict(self.floors), refused=dict(self.refused))

    def for_task(self) -> RoutedTables:
        """The same tables, for one task: what it finds missing is its own."""
        return RoutedTables(self.tables, self.floors, refused=self.refused)


def _below(rows: pa.Table, floor: Mapping[TopicPartition, int]) -> pa.Array | None:
    """Which of ``rows`` lie below ``floor`` (None: none can)."""
    if not floor or rows.num_rows == 0:
        return None
    below = None
    for tp, at in floor.items():
        here = pc.and_(
            pc.and_(pc.equal(rows[ROWS.topic], tp.topic), pc.equal(rows[ROWS.partition], tp.partition)),
            pc.less(rows[ROWS.offset], at),
        )
        below = here if below is None else pc.or_(below, here)
    return below


def _at_or_above(rows: pa.Table, floor: Mapping[TopicPartition, int]) -> pa.Table:
    """``rows`` but for those below ``floor`` (the table holds those already)."""
    below = _below(rows, floor)
    return rows if below is None else rows.filter(pc.invert(below))


def files_by_table(files: Sequence[DataFile]) -> dict[str, list[DataFile]]:
    """A routed batch's files (:class:`RoutedFile`), as each table's own."""
    grouped: dict[str, list[DataFile]] = {}
    for routed in files:
        assert isinstance(routed, RoutedFile), routed
        grouped.setdefault(routed.table, []).append(routed.file)
    return grouped
