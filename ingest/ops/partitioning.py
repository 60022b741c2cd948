"""``ingest evolve-partitioning``: the rows table's partition spec evolved to ``partition_by``, as an
explicit, checked change (a run refuses a table partitioned otherwise, and never changes it itself).

One metadata commit that requires the table's current spec (another writer's spec change in
between makes it fail, retryable, and change nothing) and adds no snapshot, so the ledger and every
batch in flight are untouched: new data files follow the new spec, files written before keep
theirs, and Iceberg plans scans over both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ingest.assembly import layout
from ingest.config import PipelineConfig
from ingest.iceberg.catalog import absent
from ingest.iceberg.layout import evolve_spec, exists, open_table

Evolution = Literal["evolved", "unchanged", "dry-run", "no-table"]


@dataclass(frozen=True)
class Repartitioned:
    pipeline: str
    table: str
    status: Evolution
    #: the spec before and after, as ``transform(column)`` items
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "table": self.table,
            "status": self.status,
            "before": list(self.before),
            "after": list(self.after),
        }


def evolve_partitioning(config: PipelineConfig, *, dry_run: bool = False) -> Repartitioned:
    """Evolve the rows table's partition spec to ``config.partition_by`` (with ``dry_run``, say how)."""
    if absent(config.catalog) is not None:  # opening the catalog would create its file
        return Repartitioned(config.pipeline, config.table, "no-table")
    planned = layout(config)  # the transforms checked against the columns' types, before any change
    assert planned.catalog is not None
    if not exists(planned.catalog, config.table):
        return Repartitioned(config.pipeline, config.table, "no-table")
    # its spec not checked: it is what changes here
    rows = open_table(planned.catalog, config.table, planned.schema, renames=config.renames)
    before, after = evolve_spec(rows, config.partition_by, dry_run=dry_run)
    status: Evolution = "unchanged" if before == after else "dry-run" if dry_run else "evolved"
    return Repartitioned(config.pipeline, config.table, status, tuple(before), tuple(after))
