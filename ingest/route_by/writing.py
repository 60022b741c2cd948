"""Writing for ``route_by``: the batch's rows split by their table into each table's data files,
leaving out those below the table's floor (see :mod:`ingest.route_by`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, Self

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.ledger import TopicPartition
from ingest.intents import DataFile
from ingest.ports import FileWriter
from ingest.records import ROUTE_COLUMN, ROWS


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


def rows_below(rows: pa.Table, floor: Mapping[TopicPartition, int]) -> pa.Array | None:
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
    below = rows_below(rows, floor)
    return rows if below is None else rows.filter(pc.invert(below))


def files_by_table(files: Sequence[DataFile]) -> dict[str, list[DataFile]]:
    """A routed batch's files (:class:`RoutedFile`), as each table's own."""
    grouped: dict[str, list[DataFile]] = {}
    for routed in files:
        assert isinstance(routed, RoutedFile), routed
        grouped.setdefault(routed.table, []).append(routed.file)
    return grouped
