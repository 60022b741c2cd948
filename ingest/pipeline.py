"""One pipeline: plan a batch, turn its ranges into data files, commit both tables exactly once.

Engines differ only in :meth:`~ingest.ports.Engine.produce` (how planned ranges become Parquet
files); planning and committing are here, shared. A run is assembled (config, tables, engine) by
:mod:`ingest.runner`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from ingest import failpoints
from ingest.committer import DeadLettersCommit, RowsCommit, commit_dead_letters, commit_rows, observe
from ingest.config import PipelineConfig
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Found, merge_timestamps
from ingest.core.plan import Batch, KafkaView, PlanPolicy, plan_batch
from ingest.dead_letters import settle
from ingest.errors import Fenced
from ingest.iceberg.catalog import connect
from ingest.iceberg.schema import dead_letter_schema, partition_spec, rows_schema
from ingest.iceberg.table import MAIN, IcebergTable
from ingest.kafka.source import KafkaSource
from ingest.ports import Engine

log = logging.getLogger(__name__)

#: planning uses the rows table's metadata as held if it was loaded this recently
PLAN_FROM_HELD_S = 1.0


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
        }


class Pipeline:
    def __init__(self, config: PipelineConfig, source: KafkaSource, rows: IcebergTable, dead: IcebergTable) -> None:
        self.config = config
        self.source = source
        self.rows = rows
        self.dead = dead
        start = config.start if isinstance(config.start, str) else int(config.start.timestamp() * 1000)
        self.policy = PlanPolicy(start=start, on_data_loss=config.on_data_loss, max_records=config.batch.max_records)

    @classmethod
    def open(cls, config: PipelineConfig) -> Pipeline:
        catalog = connect(config.catalog)
        schema = rows_schema(config.schema_)
        rows = IcebergTable.open(catalog, config.table, schema, partition_spec(schema, config.partition_by))
        dead = IcebergTable.open(catalog, config.dead_letters, dead_letter_schema())
        source = KafkaSource(config.kafka, config.topics, config.group_id, config.batch.read_timeout_s)
        return cls(config, source, rows, dead)

    def on_branch(self, branch: str) -> Pipeline:
        """This pipeline committing rows to ``branch``, and dead letters to the dead-letter table's
        branch of the same name (a replay creates both; one begun by an older version has only the
        rows branch, and its dead letters stay on main)."""
        self.dead.refresh()
        dead = self.dead.on_branch(branch) if self.dead.branch_head(branch) is not None else self.dead
        return Pipeline(self.config, self.source, self.rows.on_branch(branch), dead)

    def ledger(self, max_age_s: float = 0.0) -> Found | None:
        return observe(self.rows, self.config.pipeline, max_age_s)

    def plan(self, view: KafkaView | None = None) -> Batch:
        # metadata loaded a moment ago (opening the table) is current enough to plan from: if
        # another writer moved the head since, the commit conflicts and observes again
        found = self.ledger(max_age_s=PLAN_FROM_HELD_S)
        view = view or self.source.describe()
        from_time = None
        if found is None and isinstance(self.policy.start, int):  # the first batch starts at a time
            from_time = self.source.offsets_for_time(sorted(view.partitions), self.policy.start)
        return plan_batch(found.ledger if found else None, view, self.policy, from_time)

    def run_batch(self, engine: Engine) -> BatchResult:
        """Plan and commit one batch; a fenced batch is planned again up to ``commit.max_replans``."""
        batch = self.plan()
        for _ in range(self.config.commit.max_replans + 1):
            result = self._attempt(batch, engine)
            if result is not None:
                return result
            log.warning(
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

    def _attempt(self, batch: Batch, engine: Engine) -> BatchResult | None:
        started = time.monotonic()
        ranges = [(tp.topic, tp.partition, s, e) for tp, s, e in batch.ranges()]
        if self.rows.branch == MAIN:  # a rollback or publish may still owe its dead-letter step
            settle(self.dead, self.config.pipeline, self.config.topics, batch.base, self.config.commit.max_attempts)
        if not batch.moves_ledger:
            return BatchResult(self.config.pipeline, batch.number - 1, "empty", None, ranges=ranges)
        produced = engine.produce(batch)
        config = self.config
        dead = commit_dead_letters(
            self.dead, DeadLettersCommit(config.pipeline, batch, produced.dead_letters, config.commit.max_attempts)
        )
        failpoints.reach("between-commits")
        ledger = batch.ledger(merge_timestamps([batch.base.timestamps if batch.base else {}, produced.timestamps]))
        counts = BatchCounts(
            records=produced.records - produced.dead_letters.num_rows,
            dead_letters=produced.dead_letters.num_rows,
            bytes=produced.nbytes,
        )
        request = RowsCommit(config.pipeline, batch, ledger, produced.files, counts, config.commit.max_attempts)
        outcome = commit_rows(self.rows, request)
        if outcome.decision is Decision.FENCED:
            return None
        failpoints.reach("after-commit")
        self.source.commit_advisory(batch.end)
        return BatchResult(
            self.config.pipeline,
            batch.number,
            "committed" if outcome.decision is Decision.COMMIT else "landed",
            outcome.snapshot_id,
            records=counts.records,
            dead_letters=dead if outcome.decision is Decision.COMMIT else 0,
            bytes=produced.nbytes,
            seconds=time.monotonic() - started,
            ranges=ranges,
        )

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
