"""One pipeline: plan a batch, turn its ranges into data files, commit both tables exactly once.

Engines differ only in :meth:`~ingest.ports.Engine.produce` (how planned ranges become Parquet
files); planning and committing are here, shared. A run is assembled (config, tables, engine) by
:mod:`ingest.runner`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ingest import failpoints, formats
from ingest.batch_commit import BatchCommit, commit_batch
from ingest.committer import FloorCommit, commit_floor, observe
from ingest.config import (
    REGISTRY_FORMATS,
    ROUTE_VALUE,
    ROUTE_VALUE_CHARS,
    PipelineConfig,
    TopicSource,
    schema_file_text,
)
from ingest.core.commit import Decision
from ingest.core.ledger import (
    BatchCounts,
    Found,
    Ledger,
    TopicPartition,
    decode,
    decode_counts,
    merge_timestamps,
    registered_pipelines,
)
from ingest.core.plan import Batch, KafkaView, PlanPolicy, plan_batch
from ingest.core.poison import too_many
from ingest.dead_letters import settle
from ingest.errors import (
    ConfigError,
    Fenced,
    SchemaAhead,
    SchemaChangeRefused,
    SubjectNotFound,
    TableMismatch,
    TooManyDeadLetters,
    TopicIdChanged,
    TopicMoved,
    firsts_text,
)
from ingest.formats import keys
from ingest.iceberg.catalog import absent, connect
from ingest.iceberg.schema import dead_letter_schema, partition_spec, rows_schema, sort_order
from ingest.iceberg.table import Catalog, IcebergTable, PartitionSpec, Schema
from ingest.kafka.source import KafkaSource
from ingest.logcontext import about
from ingest.ports import DataFile, Engine, Produced, SchemaRegistry, WriterSchema
from ingest.records import (
    EXTRA_COLUMN,
    HEADERS_COLUMN,
    HEADERS_TYPE,
    KEY_COLUMN,
    Declared,
    Field,
    Merged,
    SortKey,
    merge,
    parse_sort,
    parse_transform,
    renamed,
)
from ingest.retry import RETRIED
from ingest.routing import RoutedTables, files_by_table

log = logging.getLogger(__name__)

#: planning uses the rows table's metadata as held if it was loaded this recently
PLAN_FROM_HELD_S = 1.0
#: how often one batch is produced again for a schema its records turned out to need; past that, the
#: batch ends before the records of the next such schema (see :meth:`Pipeline._produce`)
MAX_SCHEMA_CATCH_UPS = 5


#: what became of a batch: committed now, found already landed (an earlier attempt whose
#: acknowledgement was lost, or an identical copy), or nothing to do
BatchStatus = Literal["committed", "landed", "empty"]


@dataclass(frozen=True)
class BatchResult:
    pipeline: str
    batch: int
    status: BatchStatus
    snapshot_id: int | None
    records: int = 0
    dead_letters: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: records with JSON fields the table does not declare (dropped, captured or dead letters: ``unknown_fields``)
    unknown_fields: int = 0
    #: commit attempts that had to observe again, by why: ``conflict``, ``unknown`` (see
    #: :data:`ingest.retry.RETRIED`) and ``fenced`` (the batch was planned again)
    retries: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "pipeline": self.pipeline,
            "batch": self.batch,
            "status": self.status,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "dead_letters": self.dead_letters,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "ranges": [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in self.ranges],
            "unknown_fields": self.unknown_fields,
            "commit_retries": dict(self.retries),
        }


class Pipeline:
    def __init__(
        self,
        config: PipelineConfig,
        source: KafkaSource,
        rows: IcebergTable,
        dead: IcebergTable,
        fields: Sequence[Declared] | None = None,
        registry: SchemaRegistry | None = None,
        routes: Routes | None = None,
    ) -> None:
        self.config = config
        self.source = source
        #: the table whose snapshots carry the ledger: the rows table, or with ``route_by`` the ledger's table
        self.rows = rows
        self.dead = dead
        self.registry = registry
        #: with ``route_by``: the tables records are routed to, and how a new one is created
        self.routes = routes
        #: the rows table's fields records are decoded into (``schema:``, or the registry subject's,
        #: evolved as the records' writer schemas require)
        self.fields: list[Declared] = list(fields if fields is not None else config.schema_ or [])
        start = config.start if isinstance(config.start, str) else int(config.start.timestamp() * 1000)
        self.policy = PlanPolicy(start=start, on_data_loss=config.on_data_loss, max_records=config.batch.max_records)
        #: markers whose dead-letter step this process saw done (a step, once done, stays done)
        self._settled: set[str] = set()

    @classmethod
    def open(cls, config: PipelineConfig) -> Pipeline:
        """The pipeline of ``config``: its tables opened, created if missing (see :func:`layout`)."""
        planned = layout(config)
        assert planned.catalog is not None
        dead = IcebergTable.open(planned.catalog, config.dead_letters, dead_letter_schema())
        if config.route_by is not None:
            ledger = IcebergTable.open(planned.catalog, config.table, rows_schema([]))  # the ledger's: no rows
            routes = Routes.open(config, planned)
            return cls(config, planned.source, ledger, dead, planned.fields, planned.registry, routes)
        rows = IcebergTable.open(
            planned.catalog,
            config.table,
            planned.schema,
            planned.spec,
            config.renames,
            properties=config.table_properties,
            sort_by=planned.sort_by,
        )
        return cls(config, planned.source, rows, dead, planned.fields, planned.registry)

    @property
    def target(self) -> IcebergTable | RoutedTables:
        """Where an engine writes the batch's data files: the rows table, or the routed tables."""
        return self.routes.tables if self.routes is not None else self.rows

    @classmethod
    def open_existing(cls, config: PipelineConfig) -> Pipeline | None:
        """The pipeline if its rows table exists, else None, creating nothing: what the read-only
        commands (``status``, ``history``, ``verify``) open."""
        if absent(config.catalog) is not None:  # opening the catalog would create its file
            return None
        if not IcebergTable.exists(connect(config.catalog, config.commit.request_timeout_s), config.table):
            return None
        return cls.open(config)  # the dead-letter table too: missing (renamed in the config?), it is created empty

    def on_branch(self, branch: str) -> Pipeline:
        """This pipeline committing rows to ``branch``, and dead letters to the dead-letter table's
        branch of the same name (a replay creates both; one begun by an older version has only the
        rows branch, and its dead letters stay on main)."""
        self.dead.refresh()
        dead = self.dead.on_branch(branch) if self.dead.branch_head(branch) is not None else self.dead
        return Pipeline(self.config, self.source, self.rows.on_branch(branch), dead, self.fields, self.registry)

    def ledger(self, max_age_s: float = 0.0) -> Found | None:
        return observe(self.rows, self.config.pipeline, max_age_s)

    def plan(self, view: KafkaView | None = None) -> Batch:
        # metadata loaded a moment ago (opening the table) is current enough to plan from: if
        # another writer moved the head since, the commit conflicts and observes again
        found = self.ledger(max_age_s=PLAN_FROM_HELD_S)
        view = view or self.source.describe()
        known = found.ledger.topics if found is not None else frozenset()
        self._not_read_elsewhere({tp.topic for tp in view.partitions} - known)
        from_time = None
        if found is None and isinstance(self.policy.start, int):  # the first batch starts at a time
            from_time = self.source.offsets_for_time(sorted(view.partitions), self.policy.start)
        try:
            return plan_batch(found.ledger if found else None, view, self.policy, from_time)
        except TopicIdChanged as error:
            raise for_table(self.config, error) from None

    def _not_read_elsewhere(self, new: set[str]) -> None:
        """Fail closed when a topic new to this table's ledger is in the ledger of another table of
        the config (``tables:``): it moved here (another entry listed it, a pattern changed), and
        reading it from the start would store what the other table holds twice."""
        if not new or not self.config.siblings:
            return
        for sibling in self.config.siblings:
            table = IcebergTable.existing(self.rows.catalog, sibling)
            found = observe(table, self.config.pipeline) if table is not None else None
            if found is None or not new & found.ledger.topics:
                continue
            moved = sorted(new & found.ledger.topics)
            where = ",".join(
                f"{tp.topic}:{tp.partition}={end}"
                for tp, end in sorted(found.ledger.offsets.items())
                if tp.topic in moved
            )
            raise TopicMoved(
                f"topic(s) {', '.join(moved)} now feed {self.config.table}, but {sibling} has read them (its ledger "
                f"ends at {where}): reading them here from the start would store those records twice. To go on "
                f"where {sibling} stopped: ingest reset -c CONFIG --table {self.config.table} --to-offsets {where} "
                "--reason moved; to store them twice on purpose, give their earliest offsets the same way."
            )

    def run_batch(self, engine: Engine) -> BatchResult:
        """Plan and commit one batch; a fenced batch is planned again up to ``commit.max_replans``."""
        with about(pipeline=self.config.pipeline):
            return self._run_batch(engine)

    def _run_batch(self, engine: Engine) -> BatchResult:
        batch = self.plan()
        before = RETRIED.copy()
        for fenced_times in range(self.config.commit.max_replans + 1):
            with about(batch=batch.number):
                result = self._attempt_ending_early(batch, engine)
            if result is not None:
                retried = {why: RETRIED[why] - before[why] for why in ("conflict", "unknown")}
                result = replace(result, retries={**retried, "fenced": fenced_times})
                if result.snapshot_id is not None:
                    log.info(
                        "batch %d %s: snapshot %d, %d records, %d dead letters, %.2fs",
                        result.batch,
                        result.status,
                        result.snapshot_id,
                        result.records,
                        result.dead_letters,
                        result.seconds,
                        extra={
                            "batch": result.batch,
                            "snapshot_id": result.snapshot_id,
                            "status": result.status,
                            "records": result.records,
                            "dead_letters": result.dead_letters,
                            "seconds": round(result.seconds, 3),
                        },
                    )
                return result
            # a normal outcome with several copies running: with -v only (the final result is printed)
            log.info(
                "batch %d of %r was fenced by another writer; planning again",
                batch.number,
                self.config.pipeline,
            )
            fenced = batch
            batch = self.plan()
        observed = self.ledger()
        raise Fenced(
            self.config.pipeline,
            self.config.table,
            fenced.number,
            observed.ledger.batch if observed else None,
        )

    def _attempt_ending_early(self, batch: Batch, engine: Engine) -> BatchResult | None:
        """:meth:`_attempt`, of ``batch`` ended early as often as producing it asks (:class:`_EndsEarly`:
        each time it reads less, so this ends)."""
        while True:
            try:
                return self._attempt(batch, engine)
            except _EndsEarly as early:
                batch = early.batch

    def _attempt(self, batch: Batch, engine: Engine) -> BatchResult | None:
        started = time.monotonic()
        ranges = [(tp.topic, tp.partition, s, e) for tp, s, e in batch.ranges()]
        self._settle(batch.base)  # what the dead-letter table owes the ledger this batch builds on
        if not batch.moves_ledger:
            return BatchResult(self.config.pipeline, batch.number - 1, "empty", None, ranges=ranges)
        produced = self._produce(batch, engine)
        self._guard(batch, produced)
        config = self.config
        ledger = batch.ledger(merge_timestamps([batch.base.timestamps if batch.base else {}, produced.timestamps]))
        counts = BatchCounts(
            records=produced.records - produced.dead_letters.num_rows,
            dead_letters=produced.dead_letters.num_rows,
            bytes=produced.nbytes,
            unknown_fields=produced.unknown,
        )
        request = BatchCommit(
            config.pipeline,
            batch,
            ledger,
            produced.files,
            produced.dead_letters,
            counts,
            config.commit.max_attempts,
        )
        committed = commit_batch(self.rows, self.dead, request, self.routes)
        if committed is None:
            return None  # fenced: another writer moved the ledger (or a routed table's floor) first
        if committed.landed_sync is not None:
            self._settled.add(committed.landed_sync)
        failpoints.reach("after-commit")
        self.source.commit_advisory(batch.end)
        mine = committed.decision is Decision.COMMIT
        return BatchResult(
            self.config.pipeline,
            batch.number,
            "committed" if mine else "landed",
            committed.snapshot_id,
            records=counts.records,
            dead_letters=committed.dead_letters,
            bytes=produced.nbytes,
            seconds=time.monotonic() - started,
            ranges=ranges,
            unknown_fields=counts.unknown_fields if mine else 0,
        )

    def _settle(self, ledger: Ledger | None) -> None:
        """Settle the marker of ``ledger`` (see :func:`ingest.dead_letters.settle`), unless this
        process settled it already."""
        sync = ledger.sync if ledger is not None else None
        if sync is None or sync.sync_id in self._settled:
            return
        settle(self.dead, self.rows, self.config, ledger, self.config.commit.max_attempts)
        self._settled.add(sync.sync_id)

    def _guard(self, batch: Batch, produced: Produced) -> None:
        """Stop ``batch`` before it commits if its dead letters are over ``dead_letters.max_ratio``."""
        policy = self.config.dead_letter_policy
        if policy.max_ratio is None:
            return
        dead = produced.dead_letters.num_rows
        this = BatchCounts(records=produced.records - dead, dead_letters=dead)
        before = []
        for snap in itertools.islice(self.rows.ancestry(), 4 * policy.window):  # resets and others' commits between
            if decode(self.config.pipeline, snap.summary) is not None:
                counts = decode_counts(self.config.pipeline, snap.summary)
                if counts.records or counts.dead_letters:
                    before.append(counts)
        why = too_many(policy.max_ratio, policy.window, policy.min_records, this, before)
        if why is None:
            return
        reasons = Counter(produced.dead_letters.column("error").to_pylist()).most_common(3)
        listed = "; ".join(f"{n}× {reason}" for reason, n in reasons)
        raise TooManyDeadLetters(
            f"batch {batch.number} of {self.config.pipeline!r}: {why}, over dead_letters.max_ratio "
            f"{policy.max_ratio:g}. Nothing was committed; the records stay in Kafka. The commonest reasons: {listed}. "
            "Fix the producer, or `schema:` and its evolution, then run again; or raise dead_letters.max_ratio to "
            "set such records aside as dead letters."
        )

    def _produce(self, batch: Batch, engine: Engine) -> Produced:
        """``batch``'s data files, decoded into the table's fields, evolved first to the registry
        subjects' latest schemas (``on_schema_change: evolve``), and again, with the batch produced
        anew, for writer schemas its records turn out to need beyond those.

        After :data:`MAX_SCHEMA_CATCH_UPS` such catch-ups, a batch that meets one more such schema
        ends before its first records (:class:`_EndsEarly`, in each partition where the chunk that
        met it holds them): the batch commits what it took so far, with the evolutions its records
        needed, and the next batch goes on from there. Where that would leave nothing to read, it
        catches up once more instead: either way every attempt makes progress."""
        config, registry = self.config, self.registry
        if registry is not None and config.on_schema_change == "evolve":
            if _values_in_registry(config):
                self._evolve([registry.latest(t.value_subject) for t in config.sources])
            if config.key_format in REGISTRY_FORMATS:
                self._evolve([_latest_key(registry, t) for t in config.sources], key=True)
        if self.routes is not None:  # which tables take rows, and where, as the batch's files are cut
            self.routes.check(self.fields)
            self.routes.read_floors(batch)
        catch_ups = 0
        while True:
            try:
                produced = engine.produce(batch, self.fields)
            except SchemaAhead as ahead:
                if catch_ups >= MAX_SCHEMA_CATCH_UPS:
                    early = batch.ending_before({TopicPartition(t, p): at for t, p, at in ahead.first})
                    if early is not None:
                        log.info(
                            "batch %d: records of schema id(s) %s need the table to evolve again, after %d "
                            "catch-ups; the batch ends before them (%s), and the next batch goes on from there",
                            batch.number,
                            ", ".join(map(str, ahead.schema_ids)),
                            catch_ups,
                            firsts_text(ahead.first),
                        )
                        raise _EndsEarly(early) from None
                catch_ups += 1
                log.info("batch %d: %s", batch.number, ahead)
                fields = self.fields
                self.catch_up(ahead)
                if catch_ups > MAX_SCHEMA_CATCH_UPS and self.fields == fields:
                    raise  # (the registry gave writer schemas the table has already: nothing would change)
                continue
            if not produced.missing or self.routes is None:
                return produced
            # rows routed to tables not created yet: create them, produce again (each time, at least
            # one table more, or refused: it ends)
            assert not produced.missing & {*self.routes.handles, *self.routes.refused}, produced.missing
            log.info(
                "batch %d: records are routed to %d table(s) not created yet; creating %s, then the batch again",
                batch.number,
                len(produced.missing),
                ", ".join(sorted(produced.missing)),
            )
            self.routes.create(sorted(produced.missing), self.fields)
            self.routes.read_floors(batch)  # a copy beside this one may have created and filled one

    def catch_up(self, ahead: SchemaAhead) -> None:
        """Evolve the table's fields to take the writer schemas records turned out to need
        (``ahead``, raised by a decoder); without a registry, ``ahead`` is raised again."""
        if self.registry is None:
            raise ahead
        writers = [self.registry.by_id(i) for i in ahead.schema_ids]
        self._evolve([w for w in writers if w is not None], key=ahead.key)

    def _evolve(self, writers: Sequence[WriterSchema], *, key: bool = False) -> None:
        """Make the table's fields (and, with the batch's commit, its schema) take ``writers``'
        records (with ``key``: their keys, into the key column)."""
        fields = self.fields
        for writer in writers:
            try:
                if key:  # the key column alone, in its place: the value columns are not the key writer's
                    column = merge([f for f in fields if f.name == KEY_COLUMN], [keys.key_field(writer)])
                    evolved = [
                        column.fields[0] if f.name == KEY_COLUMN else Field(f.name, f.type, f.required, f.doc)
                        for f in fields
                    ]
                    merged = Merged(tuple(evolved), column.problems)
                else:
                    merged = merge(fields, renamed(formats.fields_of(writer), self.config.renames))
            except ValueError as error:
                what = "a key column" if key else "a table's schema"
                raise SchemaChangeRefused(f"schema id {writer.schema_id} cannot be {what}: {error}") from None
            if merged.problems:
                raise SchemaChangeRefused(
                    f"schema id {writer.schema_id} changes a column's type in a way Iceberg cannot follow: "
                    f"{'; '.join(merged.problems)}. Nothing was committed. Set `on_schema_change: dead_letter` to set "
                    "such records aside, or write the topic into a new table."
                )
            fields = list(merged.fields)
        if [(f.name, f.type, f.required) for f in fields] != [(f.name, f.type, f.required) for f in self.fields]:
            if self.routes is not None:
                self.routes.evolve_to(fields)
            else:
                self.rows.evolve_to(fields)
            self.fields = fields

    def run(self, engine: Engine, *, until_caught_up: bool, max_batches: int | None) -> Iterator[BatchResult]:
        """Batches until the ledger reaches the end offsets seen at start (or ``max_batches``), each
        produced by ``engine``."""
        target = {tp: wm.high for tp, wm in self.source.describe().partitions.items()} if until_caught_up else None
        done = 0
        while max_batches is None or done < max_batches:
            result = self.run_batch(engine)
            done += 1
            yield result
            if target is None or result.status == "empty":
                return
            found = self.ledger(max_age_s=PLAN_FROM_HELD_S)
            if found is not None and all(found.ledger.offsets.get(tp, 0) >= end for tp, end in target.items()):
                return


class _EndsEarly(Exception):
    """The batch to attempt instead of the one being produced: ``batch``, ending earlier (see
    :meth:`Pipeline._produce`)."""

    def __init__(self, batch: Batch) -> None:
        super().__init__(f"batch {batch.number} ends early")
        self.batch = batch


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

    def __init__(self, config: PipelineConfig, planned: Layout, tables: dict[str, IcebergTable]) -> None:
        self.config = config
        self.planned = planned
        #: the tables there are, by name, as the pipeline commits to them and reads them (a refused
        #: one too if it holds the pipeline's rows: ``verify`` counts them, ``maintain`` keeps it)
        self.handles = tables
        #: the tables that cannot take the pipeline's rows now, by name, and why
        self.refused: dict[str, str] = {}
        #: the same tables, as the engine writes to them
        self.tables = RoutedTables(self.handles, refused=self.refused)
        #: each table's floor as the batch being produced read it (None: it had none)
        self._observed: dict[str, dict[TopicPartition, int] | None] = {}

    @classmethod
    def open(cls, config: PipelineConfig, planned: Layout) -> Routes:
        """The routed tables there are: those of ``route_by.table``'s namespace whose names it
        makes and that this pipeline has committed to (whatever ``allow`` says now: ``verify``
        counts their rows). Another table the template names is opened when records first name it."""
        assert config.route_by is not None and planned.catalog is not None
        prefix, _, suffix = config.route_by.table.partition(ROUTE_VALUE)
        routes = cls(config, planned, {})
        names = []
        for name in IcebergTable.names_in(planned.catalog, config.route_by.namespace):
            value = name[len(prefix) : len(name) - len(suffix)]
            if not (name.startswith(prefix) and name.endswith(suffix) and ROUTE_VALUE_CHARS.fullmatch(value)):
                continue
            table = IcebergTable.existing(planned.catalog, name)
            if table is not None and config.pipeline in registered_pipelines(table.head().properties):
                names.append(name)
        routes.create(names, planned.fields)
        return routes

    def create(self, names: Sequence[str], fields: Sequence[Declared]) -> None:
        """Open the tables ``names``, creating those that do not exist, for rows of ``fields``;
        refuse those that cannot take them."""
        config, planned = self.config, self.planned
        assert planned.catalog is not None
        schema = rows_schema(fields)
        spec = partition_spec(schema, config.partition_by)
        for name in names:
            table = IcebergTable.load_or_create(
                planned.catalog,
                name,
                schema,
                spec,
                config.renames,
                properties=config.table_properties,
                sort_by=planned.sort_by,
            )
            self._decide(name, table, fields)

    def check(self, fields: Sequence[Declared]) -> None:
        """Decide again, from each table as it is now, which take rows of ``fields``: a table
        changed since is refused, a refused one that was fixed (or dropped: it is created anew)
        takes them again."""
        for name, table in list(self.handles.items()):
            table.refresh(PLAN_FROM_HELD_S)  # as fresh as the floors the files are cut at (read_floors)
            self._decide(name, table, fields)
        self.create([name for name in self.refused if name not in self.handles], fields)

    def evolve_to(self, fields: Sequence[Declared]) -> None:
        for name, table in list(self.handles.items()):
            self._decide(name, table, fields)

    def _decide(self, name: str, table: IcebergTable, fields: Sequence[Declared]) -> None:
        """Take ``table`` for rows of ``fields`` (evolving it with its next commit), or refuse it."""
        config = self.config
        schema = rows_schema(fields)
        why = table.misfit(
            schema, partition_spec(schema, config.partition_by), config.table_properties, self.planned.sort_by
        )
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
            found = observe(table, self.config.pipeline, PLAN_FROM_HELD_S)
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


def for_table(config: PipelineConfig, error: TopicIdChanged) -> TopicIdChanged:
    """``error`` with a reset command that names ``--table`` where the config has several tables."""
    return error.on_table(config.table) if config.siblings else error


def _from_file(config: PipelineConfig) -> list[Field] | None:
    """The fields of the Avro schema file of plain Avro topics (``schema_file:``), if any; with
    ``schema:`` declared too, the file's records must fit it."""
    if config.schema_file is None:
        return None
    text = schema_file_text(config.schema_file)
    try:
        own = renamed(formats.fields_of(WriterSchema(0, "AVRO", text)), config.renames)
    except ValueError as error:
        raise ConfigError(f"schema_file {config.schema_file} cannot be a table's schema: {error}") from None
    if config.schema_:
        problems = merge(config.schema_, own).problems
        if problems:
            raise ConfigError(f"schema_file {config.schema_file} does not fit `schema:`: {'; '.join(problems)}")
        return None
    return own


@dataclass(frozen=True)
class Layout:
    """What a pipeline is before any table is touched: its clients, and the rows table's fields,
    schema and partition spec as the config, the registry and an existing table make them."""

    source: KafkaSource
    registry: SchemaRegistry | None
    #: None: not opened (``catalog_absent``)
    catalog: Catalog | None
    fields: list[Declared]
    schema: Schema
    spec: PartitionSpec
    sort_by: list[SortKey]


def layout(config: PipelineConfig, *, catalog_absent: bool = False) -> Layout:
    """The layout of ``config``'s pipeline, checked as far as it can be without writing anything:
    librdkafka's properties, the catalog, the registry subjects, the partition transforms against
    the columns' types. Raises what a run would, before its first side effect. With
    ``catalog_absent`` (a SQLite catalog whose file does not exist yet) the catalog is not opened:
    it holds no table."""
    # librdkafka checks its properties now: a misspelt one stops the run before any side effect
    source = KafkaSource(config.kafka, config.subscription, config.group_id, config.batch.read_timeout_s)
    registry = None
    if _values_in_registry(config) or config.key_format in REGISTRY_FORMATS:
        from ingest.kafka.registry import Registry  # the registry client costs ~130 ms to import

        registry = Registry(config.schema_registry or {})
    catalog = None if catalog_absent else connect(config.catalog, config.commit.request_timeout_s)
    # without `schema:`, the table's own fields (evolved per batch), or the subject's to create it
    from_file = _from_file(config)  # checked against `schema:` too
    fields: list[Declared] = list(config.schema_ or from_file or [])
    if not fields and catalog is not None:
        own = IcebergTable.fields_of(catalog, config.table) or []
        fields = list(renamed([f for f in own if f.name != KEY_COLUMN], config.renames))
    fields = fields or list(_from_subjects(config, registry))
    if config.key_format is not None:  # the key column as the table has it, or as the keys are
        had = IcebergTable.fields_of(catalog, config.table, only=[KEY_COLUMN]) if catalog is not None else None
        fields = [*fields, *(had or [_key_from(config, registry)])]
    if config.headers and all(f.name != HEADERS_COLUMN for f in fields):
        fields = [
            *fields,
            Field(HEADERS_COLUMN, HEADERS_TYPE, False, "the record's Kafka headers: each key's last value"),
        ]
    if config.unknown_fields == "capture" and all(f.name != EXTRA_COLUMN for f in fields):
        fields = [
            *fields,
            Field(EXTRA_COLUMN, "string", False, "fields the records had that the table does not declare"),
        ]
    schema = rows_schema(fields)
    sort_by = [key for item in config.sort_by if (key := parse_sort(item)) is not None]
    sort_order(schema, sort_by)  # its columns are the table's
    return Layout(source, registry, catalog, fields, schema, partition_spec(schema, config.partition_by), sort_by)


def _values_in_registry(config: PipelineConfig) -> bool:
    return config.format in REGISTRY_FORMATS and config.schema_file is None


def _key_from(config: PipelineConfig, registry: SchemaRegistry | None) -> Field:
    """The key column of a table that has none yet: a string, or the latest schemas of the topics'
    key subjects, merged."""
    if config.key_format == "string":
        return Field(KEY_COLUMN, "string", False)
    assert registry is not None  # config requires a registry then
    fix = "Fix the subject, set `key_subject:`, or leave `key_format:` out to keep keys raw."
    merged = _merged_subjects(config, lambda t: _latest_key(registry, t), lambda w: [keys.key_field(w)], "key", fix)
    return merged[0]


def _merged_subjects(
    config: PipelineConfig,
    latest: Callable[[TopicSource], WriterSchema],
    own: Callable[[WriterSchema], list[Field]],
    part: Literal["value", "key"],
    fix: str,
) -> list[Field]:
    """The fields of the topics' latest ``part`` schemas (``latest``, mapped by ``own``), merged in
    the order of ``topics:``; a schema that maps to none, or subjects that disagree, are config errors."""
    fields: list[Field] = []
    for topic in config.sources:
        writer = latest(topic)
        subject = topic.key_subject_name if part == "key" else topic.value_subject
        try:
            mine = own(writer)
            merged = merge(fields, mine) if fields else Merged(tuple(mine), ())
        except ValueError as error:
            what = "a key column" if part == "key" else "a table's schema"
            raise ConfigError(
                f"the latest schema of subject {subject!r} (id {writer.schema_id}) cannot be {what}: {error}. {fix}"
            ) from None
        if merged.problems:
            kind = "key subjects" if part == "key" else "subjects"
            raise ConfigError(f"the {kind} of `topics:` disagree: {'; '.join(merged.problems)}")
        fields = list(merged.fields)
    return fields


def _latest_key(registry: SchemaRegistry, topic: TopicSource) -> WriterSchema:
    try:
        return registry.latest(topic.key_subject_name)
    except SubjectNotFound:
        raise SubjectNotFound(
            f"the Schema Registry has no subject {topic.key_subject_name!r}, which the key column of topic "
            f"{topic.name!r} is derived from (key_format: {topic.key_format}). Register the key schema first (a "
            "producer's serializer does on its first record), set `key_subject:` on the topic, or leave "
            "`key_format:` out to keep keys raw."
        ) from None


def _from_subjects(config: PipelineConfig, registry: SchemaRegistry | None) -> list[Field]:
    """The rows table's fields when ``schema:`` is omitted: the latest schemas of the topics'
    subjects, merged (in the order of ``topics:``)."""
    assert registry is not None  # config requires a registry format then
    fields = _merged_subjects(
        config,
        lambda t: registry.latest(t.value_subject),
        lambda w: renamed(formats.fields_of(w), config.renames),
        "value",
        "Declare `schema:` for the fields you want, or fix the subject.",
    )
    names = {f.name for f in fields} | ({KEY_COLUMN} if config.key_format == "string" else set())
    for item in config.partition_by:
        transform = parse_transform(item)
        column = transform.column if transform is not None else item  # validated in config
        if column not in names:
            raise ConfigError(f"partition_by: {item!r} refers to {column!r}, which the registry's schema does not have")
    return fields
