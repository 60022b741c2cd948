"""``ingest maintain``: compaction, snapshot expiry and orphan-file removal that keep the ledger.

Every snapshot this module creates re-stamps the current ledger of every registered pipeline, and
expiry never removes the newest ledger-bearing snapshot of a registered pipeline, nor any snapshot
between it and the branch head (the lookup walks parent links). Compaction is a concurrent writer:
it commits with a compare-and-swap on the head, so a batch that lands meanwhile makes it observe
again and re-stamp the new ledger; it never loses or duplicates a batch.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from ingest.committer import observe
from ingest.config import MaintenanceSpec
from ingest.core.ledger import BatchCounts, encode, find_ledger, registered_pipelines
from ingest.errors import CommitGaveUp
from ingest.iceberg import CommitConflict, CommitUnknown, DataFile, IcebergTable
from ingest.pipeline import Pipeline

log = logging.getLogger(__name__)
MB = 1024 * 1024
ATTEMPTS = 8


def restamped_summary(table: IcebergTable, operation: str) -> dict[str, str]:
    """The current ledger of every registered pipeline, for a snapshot that is not a batch."""
    head = table.refresh()
    summary = {"ingest.maintenance": operation}
    for name in registered_pipelines(head.properties):
        found = find_ledger(name, table.ancestry())
        if found is not None:
            summary |= encode(name, found.ledger, BatchCounts(), extra={"restamped-by": operation})
    return summary


def protected_snapshots(table: IcebergTable) -> set[int]:
    """Snapshots expiry must keep: each registered pipeline's newest ledger and the path to it."""
    head = table.head()
    keep: set[int] = set()
    pending = set(registered_pipelines(head.properties))
    for snap in table.ancestry():
        if not pending:
            break
        keep.add(snap.snapshot_id)
        pending -= {name for name in pending if f"ingest.{name}.offsets" in snap.summary}
    return keep


def expire(table: IcebergTable, spec: MaintenanceSpec, now_ms: int) -> list[int]:
    table.refresh()
    snapshots = sorted(table.all_snapshots(), key=lambda s: s.timestamp_ms)
    keep = protected_snapshots(table) | {s.snapshot_id for s in snapshots[-spec.keep_last_snapshots :]}
    cutoff = now_ms - int(spec.snapshot_retention_hours * 3_600_000)
    doomed = [s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in keep]
    for _ in range(ATTEMPTS):
        try:
            table.expire(doomed)
            return doomed
        except CommitConflict:  # a batch landed: the protected set may have moved on
            table.refresh()
            keep |= protected_snapshots(table)
            doomed = [i for i in doomed if i not in keep]
    raise CommitGaveUp(f"snapshot expiry on {table.identifier} kept conflicting with other writers; run again")


def remove_orphans(table: IcebergTable, spec: MaintenanceSpec, now_s: float) -> list[str]:
    """Delete data files no snapshot references (crashed or fenced batches), once old enough."""
    table.refresh()
    referenced = table.referenced_paths()
    cutoff = now_s - spec.orphan_age_hours * 3600
    removed = []
    for path, modified in table.stored_data_files():
        if path not in referenced and modified < cutoff:
            table.delete_file(path)
            removed.append(path)
    return removed


def _groups(files: list[DataFile], small_bytes: int) -> list[list[DataFile]]:
    by_partition: dict[tuple[int, str], list[DataFile]] = defaultdict(list)
    for data_file in files:
        if data_file.file_size_in_bytes < small_bytes:
            by_partition[(data_file.spec_id, repr(data_file.partition))].append(data_file)
    return [group for group in by_partition.values() if len(group) > 1]


def compact(table: IcebergTable, spec: MaintenanceSpec) -> dict[str, int]:
    """Rewrite small files per partition into files of about the target size."""
    table.refresh()
    groups = _groups(table.live_data_files(), int(spec.small_file_mb * MB))
    if not groups:
        return {"files_removed": 0, "files_added": 0}
    remove = [f for group in groups for f in group]
    add: list[DataFile] = []
    for group in groups:
        add.extend(table.write(table.read_files(group), target_file_bytes=int(spec.target_file_mb * MB)))
    for _ in range(ATTEMPTS):
        summary = restamped_summary(table, "compaction")
        live = {f.file_path for f in table.live_data_files()}
        if not all(f.file_path in live for f in remove):
            log.warning("compaction of %s skipped: another writer removed some of its input files", table.identifier)
            return {"files_removed": 0, "files_added": 0}
        try:
            table.rewrite(remove, add, summary)
            return {"files_removed": len(remove), "files_added": len(add)}
        except (CommitConflict, CommitUnknown) as error:
            log.info("compaction commit on %s must be observed again: %s", table.identifier, error)
            table.refresh()
            if _landed(table, add):
                return {"files_removed": len(remove), "files_added": len(add)}
    raise CommitGaveUp(f"compaction of {table.identifier} kept conflicting with other writers; run again")


def _landed(table: IcebergTable, added: list[DataFile]) -> bool:
    live = {f.file_path for f in table.live_data_files()}
    return bool(added) and all(f.file_path in live for f in added)


def maintain(pipeline: Pipeline, now: float | None = None) -> dict[str, Any]:
    spec = pipeline.config.maintenance
    now = time.time() if now is None else now
    observe(pipeline.rows, pipeline.config.pipeline)  # fail closed before touching a table whose ledger is lost
    report: dict[str, Any] = {"pipeline": pipeline.config.pipeline}
    for label, table in (("table", pipeline.rows), ("dead_letters", pipeline.dead)):
        result: Mapping[str, Any] = {
            **compact(table, spec),
            "snapshots_expired": len(expire(table, spec, int(now * 1000))),
            "orphans_removed": len(remove_orphans(table, spec, now)),
        }
        report[label] = dict(result)
    return report
