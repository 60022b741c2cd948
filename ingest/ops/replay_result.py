"""What ``ingest replay`` reports: its result, a replay's branch compared with main partition by
partition (ledger offsets and rows), and the other writers' snapshots a rollback took off main."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

import pyarrow as pa

from ingest import records
from ingest.assembly import Opened
from ingest.batch_result import BatchResult
from ingest.core.ledger_codec import find_ledger
from ingest.iceberg.table import IcebergTable


def _rows_per_partition(table: IcebergTable, branch_snapshot: int | None) -> Counter[tuple[str, int]]:
    if branch_snapshot is None:
        return Counter()
    c = records.ROWS
    data: pa.Table = table.scan_columns([c.topic, c.partition], branch_snapshot)
    counts = data.group_by([c.topic, c.partition]).aggregate([([], "count_all")]).to_pylist()
    return Counter({(r[c.topic], r[c.partition]): r["count_all"] for r in counts})


ReplayAction = Literal["replayed", "published", "rolled-back"]


@dataclass(frozen=True)
class BranchComparison:
    """One partition of main against the replay's branch: ledger offset and rows on each."""

    topic: str
    partition: int
    main_offset: int | None
    branch_offset: int | None
    main_rows: int
    branch_rows: int


@dataclass(frozen=True)
class Discarded:
    """A snapshot of another writer that a rollback took off main."""

    snapshot_id: int
    operation: str | None


@dataclass(frozen=True)
class ReplayResult:
    """``ingest replay``: a branch replayed (and compared with main, or published), or main rolled back."""

    pipeline: str
    from_snapshot: int
    action: ReplayAction
    #: the batch of the ledger the replay started from
    ledger_batch: int | None = None
    branch: str | None = None
    batches: tuple[BatchResult, ...] | None = None
    comparison: tuple[BranchComparison, ...] | None = None
    #: publish: main's new head, and how many other writers' commits were carried over onto it
    published: int | None = None
    reapplied: int | None = None
    #: rollback: main's new head, and the other writers' commits it took off main
    main: int | None = None
    discarded_foreign: tuple[Discarded, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"pipeline": self.pipeline, "from_snapshot": self.from_snapshot, "action": self.action}
        for key in ("ledger_batch", "branch", "published", "reapplied", "main"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        if self.batches is not None:
            data["batches"] = [b.as_dict() for b in self.batches]
        if self.comparison is not None:
            data["comparison"] = [asdict(c) for c in self.comparison]
        if self.discarded_foreign is not None:
            data["discarded_foreign"] = [asdict(d) for d in self.discarded_foreign]
        return data


def compare(pipeline: Opened, branch: str) -> tuple[BranchComparison, ...]:
    rows = pipeline.rows
    rows.refresh()
    name = pipeline.config.pipeline
    main_head, branch_head = rows.branch_head("main"), rows.branch_head(branch)
    main_ledger = find_ledger(name, rows.ancestry(main_head)) if main_head else None
    branch_ledger = find_ledger(name, rows.ancestry(branch_head)) if branch_head else None
    main_rows, branch_rows = _rows_per_partition(rows, main_head), _rows_per_partition(rows, branch_head)
    tps = sorted(
        set(main_ledger.ledger.offsets if main_ledger else {})
        | set(branch_ledger.ledger.offsets if branch_ledger else {})
    )
    return tuple(
        BranchComparison(
            tp.topic,
            tp.partition,
            main_ledger.ledger.offsets.get(tp) if main_ledger else None,
            branch_ledger.ledger.offsets.get(tp) if branch_ledger else None,
            main_rows[(tp.topic, tp.partition)],
            branch_rows[(tp.topic, tp.partition)],
        )
        for tp in tps
    )
