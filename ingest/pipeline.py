"""One pipeline: plan a batch, turn its ranges into data files, commit both tables exactly once.

Engines differ only in :meth:`~ingest.ports.Engine.produce` (how planned ranges become Parquet
files); planning and committing are here, shared, over ports only (:mod:`ingest.ports`): the Iceberg
tables, the Kafka source and the registry a config names are opened by :mod:`ingest.assembly`,
and a run (pipeline and engine) by :mod:`ingest.runner`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Generic, TypeVar

from ingest import failpoints
from ingest.batch_commit import BatchCommit, commit_batch
from ingest.batch_result import BatchResult
from ingest.committer import HELD_S, observe
from ingest.config import PipelineConfig
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Found, Ledger, TopicPartition, merge_timestamps
from ingest.core.ledger_codec import decode, decode_counts
from ingest.core.plan import Batch, KafkaView, PlanPolicy, plan_batch
from ingest.core.poison import too_many
from ingest.dead_letters import settle
from ingest.errors import Fenced, SchemaAhead, TooManyDeadLetters, TopicIdChanged, firsts_text
from ingest.fields import evolved, latest_key, row_of, values_in_registry
from ingest.format_names import REGISTRY_FORMATS
from ingest.logcontext import about
from ingest.ports import Engine, LedgerTable, Produced, SchemaRegistry, Source, WriterSchema
from ingest.progress import Progress
from ingest.records import Declared
from ingest.retry import RETRIED
from ingest.route_by.tables import Routes
from ingest.route_by.writing import RoutedTables
from ingest.siblings import for_table, not_read_elsewhere

log = logging.getLogger(__name__)

#: how often one batch is produced again for a schema its records turned out to need; past that, the
#: batch ends before the records of the next such schema (see :meth:`Pipeline._produce`)
MAX_SCHEMA_CATCH_UPS = 5


TableT = TypeVar("TableT", bound=LedgerTable)
SourceT = TypeVar("SourceT", bound=Source)


class Pipeline(Generic[TableT, SourceT]):
    """The batch loop of one config over its tables (``TableT``) and source (``SourceT``), which
    :mod:`ingest.assembly` opens (tests and integrations may give it others, see
    :mod:`ingest.testing`): plan a batch, have an engine produce it, commit both tables."""

    def __init__(
        self,
        config: PipelineConfig,
        source: SourceT,
        rows: TableT,
        dead: TableT,
        fields: Sequence[Declared] | None = None,
        registry: SchemaRegistry | None = None,
        routes: Routes | None = None,
        siblings: Callable[[str], LedgerTable | None] | None = None,
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
        #: the rows table of another entry of the config (``tables:``) by name, if it exists
        self.siblings = siblings or _none
        #: markers whose dead-letter step this process saw done (a step, once done, stays done)
        self._settled: set[str] = set()

    @property
    def target(self) -> TableT | RoutedTables:
        """Where an engine writes the batch's data files: the rows table, or the routed tables."""
        return self.routes.tables if self.routes is not None else self.rows

    def on_branch(self, branch: str) -> Pipeline[TableT, SourceT]:
        """This pipeline committing rows to ``branch``, and dead letters to the dead-letter table's
        branch of the same name (a replay creates both; one begun by an older version has only the
        rows branch, and its dead letters stay on main)."""
        self.dead.refresh()
        dead = self.dead.on_branch(branch) if self.dead.branch_head(branch) is not None else self.dead
        rows = self.rows.on_branch(branch)
        return Pipeline(self.config, self.source, rows, dead, self.fields, self.registry, siblings=self.siblings)

    def ledger(self, max_age_s: float = 0.0) -> Found | None:
        return observe(self.rows, self.config.pipeline, max_age_s)

    def plan(self, view: KafkaView | None = None) -> Batch:
        # metadata loaded a moment ago (opening the table) is current enough to plan from: if
        # another writer moved the head since, the commit conflicts and observes again
        found = self.ledger(max_age_s=HELD_S)
        view = view or self.source.describe()
        known = found.ledger.topics if found is not None else frozenset()
        not_read_elsewhere(self.config, self.siblings, {tp.topic for tp in view.partitions} - known)
        from_time = None
        if found is None and isinstance(self.policy.start, int):  # the first batch starts at a time
            from_time = self.source.offsets_for_time(sorted(view.partitions), self.policy.start)
        try:
            return plan_batch(found.ledger if found else None, view, self.policy, from_time)
        except TopicIdChanged as error:
            raise for_table(self.config, error) from None

    def run_batch(self, engine: Engine, progress: Progress | None = None) -> BatchResult:
        """Plan and commit one batch; a fenced batch is planned again up to ``commit.max_replans``.
        ``progress`` hears what the batch planned, read and became."""
        progress = progress if progress is not None else Progress(self.config.pipeline, self.config.table)
        with about(pipeline=self.config.pipeline):
            result = self._run_batch(engine, progress)
        progress.ended(result.records + result.dead_letters, result.bytes, result.ranges)
        return result

    def _run_batch(self, engine: Engine, progress: Progress) -> BatchResult:
        batch = self.plan()
        before = RETRIED.copy()
        for fenced_times in range(self.config.commit.max_replans + 1):
            with about(batch=batch.number):
                result = self._attempt_ending_early(batch, engine, progress)
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

    def _attempt_ending_early(self, batch: Batch, engine: Engine, progress: Progress) -> BatchResult | None:
        """:meth:`_attempt`, of ``batch`` ended early as often as producing it asks (:class:`_EndsEarly`:
        each time it reads less, so this ends)."""
        while True:
            try:
                return self._attempt(batch, engine, progress)
            except _EndsEarly as early:
                batch = early.batch

    def _attempt(self, batch: Batch, engine: Engine, progress: Progress) -> BatchResult | None:
        started = time.monotonic()
        ranges = [(tp.topic, tp.partition, s, e) for tp, s, e in batch.ranges()]
        self._settle(batch.base)  # what the dead-letter table owes the ledger this batch builds on
        if not batch.moves_ledger:
            return BatchResult(self.config.pipeline, batch.number - 1, "empty", None, ranges=ranges)
        produced = self._produce(batch, engine, progress)
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
            deletes=produced.deletes,
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
        reasons = produced.dead_letters.commonest_reasons(3)
        listed = "; ".join(f"{n}× {reason}" for reason, n in reasons)
        raise TooManyDeadLetters(
            f"batch {batch.number} of {self.config.pipeline!r}: {why}, over dead_letters.max_ratio "
            f"{policy.max_ratio:g}. Nothing was committed; the records stay in Kafka. The commonest reasons: {listed}. "
            "Fix the producer, or `schema:` and its evolution, then run again; or raise dead_letters.max_ratio to "
            "set such records aside as dead letters."
        )

    def _produce(self, batch: Batch, engine: Engine, progress: Progress) -> Produced:
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
            if values_in_registry(config):
                self._evolve([registry.latest(t.value_subject) for t in config.sources])
            if config.key_format in REGISTRY_FORMATS:
                self._evolve([latest_key(registry, t) for t in config.sources], key=True)
        if self.routes is not None:  # which tables take rows, and where, as the batch's files are cut
            self.routes.check(self.fields)
            self.routes.read_floors(batch)
        catch_ups = 0
        while True:
            try:
                progress.planned(batch.number, batch.ranges())  # (again: anew for each try)
                produced = engine.produce(batch, self.fields, progress.advanced)
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
        fields = evolved(self.fields, writers, self.config.renames, key=key, row=row_of(self.config))
        if [(f.name, f.type, f.required) for f in fields] != [(f.name, f.type, f.required) for f in self.fields]:
            if self.routes is not None:
                self.routes.evolve_to(fields)
            else:
                self.rows.evolve_to(fields)
            self.fields = fields

    def run(
        self, engine: Engine, *, until_caught_up: bool, max_batches: int | None, progress: Progress | None = None
    ) -> Iterator[BatchResult]:
        """Batches until the ledger reaches the end offsets seen at start (or ``max_batches``), each
        produced by ``engine``; ``progress`` hears how far the catch-up is."""
        progress = progress if progress is not None else Progress(self.config.pipeline, self.config.table)
        target = None
        if until_caught_up:
            view = self.source.describe()
            target = {tp: wm.high for tp, wm in view.partitions.items()}
            found = self.ledger(max_age_s=HELD_S)
            offsets = found.ledger.offsets if found is not None else {}
            progress.catching_up({tp: offsets.get(tp, wm.low) for tp, wm in view.partitions.items()}, target)
        else:
            progress.catching_up({}, None)
        done = 0
        while max_batches is None or done < max_batches:
            result = self.run_batch(engine, progress)
            done += 1
            yield result
            if target is None or result.status == "empty":
                return
            found = self.ledger(max_age_s=HELD_S)
            if found is not None and all(found.ledger.offsets.get(tp, 0) >= end for tp, end in target.items()):
                return


def _none(name: str) -> None:
    return None


class _EndsEarly(Exception):
    """The batch to attempt instead of the one being produced: ``batch``, ending earlier (see
    :meth:`Pipeline._produce`)."""

    def __init__(self, batch: Batch) -> None:
        super().__init__(f"batch {batch.number} ends early")
        self.batch = batch
