"""The tables a ``route_by`` pipeline routes records to (see :mod:`ingest.route_by`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ingest import failpoints
from ingest.committer import HELD_S, FloorCommit, commit_floor, observe
from ingest.config import PipelineConfig
from ingest.core.ledger import TopicPartition
from ingest.core.ledger_codec import registered_pipelines
from ingest.core.plan import Batch
from ingest.errors import TableMismatch
from ingest.intents import DataFile
from ingest.ports import RoutedTable, TableMaker
from ingest.records import Declared
from ingest.route_by.writing import RoutedTables, files_by_table

log = logging.getLogger(__name__)


class Routes:
    """The tables ``route_by`` routes records to: those there are, each with its floor (the
    ledger its own snapshots carry: it holds every record routed to it below it), created as
    batches first route records to them.

    A batch's rows below a table's floor are left out when its files are written (an earlier
    attempt of the batch, or a copy running beside it, committed them). Each table with rows is
    committed with its floor moved to the batch's end, in the order of their names, before the
    ledger's table (:meth:`commit`); a crash between those commits leaves tables whose floors are
    past the ledger, and the next batch, planned from the ledger again, adds to them only what
    lies past their floors. A table that gets no records keeps its floor: rows below it come only
    from ranges a committed batch read, so it never needs advancing without data.

    A table that exists but cannot take the pipeline's rows (another partition spec, properties or
    sort order; a schema it cannot evolve to) is *refused* (:attr:`refused`), decided again from the
    table as it is before each batch's files are cut (:meth:`check`): the records routed to it are
    dead letters saying why, but for those below its floor, and once it is fixed the next batch
    writes to it again.
    """

    def __init__(self, config: PipelineConfig, maker: TableMaker, tables: dict[str, RoutedTable]) -> None:
        self.config = config
        #: where a table records first name is opened (or created) and judged
        self.maker = maker
        #: the tables there are, by name, as the pipeline commits to them and reads them (a refused
        #: one too if it holds the pipeline's rows: ``verify`` counts them, ``maintain`` keeps it)
        self.handles = tables
        #: the tables that cannot take the pipeline's rows now, by name, and why
        self.refused: dict[str, str] = {}
        #: the same tables, as the engine writes to them
        self.tables = RoutedTables(self.handles, refused=self.refused)
        #: each table's floor as the batch being produced read it (None: it had none)
        self._observed: dict[str, dict[TopicPartition, int] | None] = {}

    def create(self, names: Sequence[str], fields: Sequence[Declared]) -> None:
        """Open the tables ``names``, creating those that do not exist, for rows of ``fields``;
        refuse those that cannot take them."""
        for name in names:
            self._decide(name, self.maker.open(name, fields), fields)

    def check(self, fields: Sequence[Declared]) -> None:
        """Decide again, from each table as it is now, which take rows of ``fields``: a table
        changed since is refused, a refused one that was fixed (or dropped: it is created anew)
        takes them again."""
        for name, table in list(self.handles.items()):
            table.refresh(HELD_S)  # as fresh as the floors the files are cut at (read_floors)
            self._decide(name, table, fields)
        self.create([name for name in self.refused if name not in self.handles], fields)

    def evolve_to(self, fields: Sequence[Declared]) -> None:
        for name, table in list(self.handles.items()):
            self._decide(name, table, fields)

    def _decide(self, name: str, table: RoutedTable, fields: Sequence[Declared]) -> None:
        """Take ``table`` for rows of ``fields`` (evolving it with its next commit), or refuse it."""
        config = self.config
        why = self.maker.misfit(table, fields)
        if why is None:
            try:
                table.evolve_to(fields)
            except TableMismatch as error:
                why = str(error)
        if why is None:
            self.handles[name] = table
            if self.refused.pop(name, None) is not None:
                log.info("route_by: %s takes the pipeline's rows again", name)
            return
        if self.refused.get(name) != why:
            log.warning("route_by: the records routed to %s are dead letters: %s", name, why)
        self.refused[name] = why
        if config.pipeline in registered_pipelines(table.head().properties):
            self.handles[name] = table  # it holds rows of the pipeline's
        else:
            self.handles.pop(name, None)

    def read_floors(self, batch: Batch) -> None:
        """Each table's floor, as ``batch``'s files are cut at it (rows below it are left out)."""
        self._observed = {}
        inside: dict[str, Mapping[TopicPartition, int]] = {}
        for name, table in self.handles.items():
            found = observe(table, self.config.pipeline, HELD_S)
            floor = dict(found.ledger.offsets) if found is not None else None
            self._observed[name] = floor
            # only where it lies inside the batch can it leave rows out
            cut = {tp: at for tp, at in (floor or {}).items() if at > batch.start.get(tp, at)}
            if cut:
                inside[name] = cut
        self.tables.floors = inside

    def commit(self, batch: Batch, files: Sequence[DataFile]) -> bool:
        """Commit each table's rows of ``batch`` with its floor moved to the batch's end; False if a
        table's floor moved since the files were cut (nothing of it is committed: plan again)."""
        for name, mine in sorted(files_by_table(files).items()):
            request = FloorCommit(
                self.config.pipeline, batch, mine, self._observed.get(name), self.config.commit.max_attempts
            )
            if not commit_floor(self.handles[name], request):
                log.info("batch %d: another writer committed to %s meanwhile; planning again", batch.number, name)
                return False
            failpoints.reach("after-table")
        return True
