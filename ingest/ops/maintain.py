"""``ingest maintain``: compaction, snapshot expiry and orphan-file removal that keep the ledger.

Every snapshot this module creates re-stamps the current ledger of every registered pipeline.
Expiry never removes a snapshot a branch or tag points at, nor, on any branch, the newest
ledger-bearing snapshot of a registered pipeline or a snapshot between it and the branch head (the
lookup walks parent links). Both are concurrent writers: compaction commits with a
compare-and-swap on the head, expiry requires every ref to be where it saw it, so a batch, a
rollback or a replay that lands meanwhile makes them plan again; they never lose or duplicate a
batch.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ingest.assembly import Opened, routed_tables
from ingest.committer import observe
from ingest.config import MaintenanceSpec
from ingest.core.expiry import doomed, protected
from ingest.core.ledger import BatchCounts
from ingest.core.ledger_codec import COMPACTION, MAINTENANCE_KEY, encode, find_ledger, registered_pipelines
from ingest.dead_letters import settle
from ingest.errors import CommitConflict, CommitGaveUp, CommitUnknown
from ingest.iceberg.files import (
    EqualityDeletes,
    delete_file,
    live_data_files,
    live_files,
    read_files,
    read_live,
    referenced_paths,
    removable,
    scan_tasks,
    stored_data_files,
    unreferenced,
)
from ingest.iceberg.reading import all_snapshots, refs, snapshot_summary
from ingest.iceberg.table import DataFile, IcebergTable
from ingest.intents import DataFile as WrittenFile
from ingest.intents import Expire, Rewrite
from ingest.retry import with_retries

log = logging.getLogger(__name__)
MB = 1024 * 1024
ATTEMPTS = 8


def restamped_summary(table: IcebergTable, operation: str) -> dict[str, str]:
    """The current ledger of every registered pipeline, for a snapshot that is not a batch."""
    head = table.refresh()
    summary = {MAINTENANCE_KEY: operation}
    for name in registered_pipelines(head.properties):
        found = find_ledger(name, table.ancestry())
        if found is not None:
            summary |= encode(name, found.ledger, BatchCounts(), extra={"restamped-by": operation})
    return summary


def _doomed(table: IcebergTable, spec: MaintenanceSpec, now_ms: int) -> list[int]:
    pipelines = registered_pipelines(table.head().properties)
    keep = protected(refs(table), table.ancestry, pipelines)
    cutoff = now_ms - int(spec.snapshot_retention_hours * 3_600_000)
    return doomed(all_snapshots(table), keep, spec.keep_last_snapshots, cutoff)


def expire(table: IcebergTable, spec: MaintenanceSpec, now_ms: int) -> list[int]:
    """Expire what is older than the retention and not protected; returns the expired ids.

    Planned on freshly loaded metadata and committed requiring every ref to be unchanged, so a
    batch, rollback, replay or tag that lands in between makes it plan again from the new state.
    """

    def attempt(number: int) -> list[int]:
        table.refresh()
        doomed = _doomed(table, spec, now_ms)
        try:
            table.commit(Expire(doomed))
        except (CommitConflict, CommitUnknown):
            table.refresh()
            if doomed and all(snapshot_summary(table, i) is None for i in doomed):
                return doomed  # the unknown outcome was a success
            raise
        return doomed

    return with_retries(
        attempt,
        ATTEMPTS,
        lambda: CommitGaveUp(f"snapshot expiry on {table.identifier} kept conflicting with other writers; run again"),
        f"snapshot expiry on {table.identifier}",
    )


def remove_orphans(table: IcebergTable, spec: MaintenanceSpec, now_s: float) -> list[str]:
    """Delete data files no snapshot references (crashed or fenced batches), once old enough."""
    table.refresh()
    cutoff = now_s - spec.orphan_age_hours * 3600
    old_enough = [path for path, modified in stored_data_files(table) if modified < cutoff]
    if not old_enough:  # (a table whose snapshots hold no files, such as route_by's ledger, has none)
        return []
    removed = []
    for path in unreferenced(old_enough, referenced_paths(table)):
        delete_file(table, path)
        removed.append(path)
    return removed


def _groups(files: list[DataFile], small_bytes: int, deleted: Mapping[str, object]) -> list[list[DataFile]]:
    """Per partition, the small files, and the files rows were deleted from (by position) whatever
    their size: a group of several, or one with deletes to apply."""
    by_partition: dict[tuple[int, str], list[DataFile]] = defaultdict(list)
    for data_file in files:
        if data_file.file_size_in_bytes < small_bytes or data_file.file_path in deleted:
            by_partition[(data_file.spec_id, repr(data_file.partition))].append(data_file)
    return [group for group in by_partition.values() if len(group) > 1 or group[0].file_path in deleted]


@dataclass(frozen=True)
class Compaction:
    files_removed: int = 0
    files_added: int = 0
    #: delete files that made compaction leave the table alone (None: there were none)
    skipped_delete_files: int | None = None
    #: position delete files removed with the data files they applied to (None: none)
    delete_files_removed: int | None = None


@dataclass(frozen=True)
class TableMaintenance:
    """What ``ingest maintain`` did to one table."""

    compaction: Compaction
    snapshots_expired: int
    orphans_removed: int

    def as_dict(self) -> dict[str, Any]:
        compaction = {k: v for k, v in asdict(self.compaction).items() if v is not None}
        return {**compaction, "snapshots_expired": self.snapshots_expired, "orphans_removed": self.orphans_removed}


@dataclass(frozen=True)
class Maintenance:
    """``ingest maintain``: the rows table (with ``route_by``: the ledger's), the dead-letter table,
    and the tables ``route_by`` routed records to."""

    pipeline: str
    table: TableMaintenance
    dead_letters: TableMaintenance
    routed: dict[str, TableMaintenance] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        done = {"pipeline": self.pipeline, "table": self.table.as_dict(), "dead_letters": self.dead_letters.as_dict()}
        if self.routed:
            done["routed_tables"] = {name: one.as_dict() for name, one in self.routed.items()}
        return done


def compact(table: IcebergTable, spec: MaintenanceSpec) -> Compaction:
    """Rewrite small files per partition into files of about the target size, and the files rows
    were deleted from by position (a changelog's) with their live rows only, removing the delete
    files that named them (:mod:`ingest.iceberg.compaction`).

    A table with equality deletes (Flink's sink writes them) is left alone: which rows they leave
    is not known here, and rewriting its data files would bring the deleted rows back."""
    table.refresh()
    files, deletes = live_files(table)
    try:
        tasks = scan_tasks(table) if deletes else {}
    except EqualityDeletes:
        log.warning(
            "compaction of %s skipped: equality deletes apply to its data (written by a merge-on-read tool such as "
            "Flink's sink); compact it with that engine's rewrite_data_files, which applies them",
            table.identifier,
        )
        return Compaction(skipped_delete_files=deletes)
    deleted = {path: task.delete_files for path, task in tasks.items() if task.delete_files}
    groups = _groups(files, int(spec.small_file_mb * MB), deleted)
    if not groups:
        return Compaction()
    remove = [f for group in groups for f in group]
    add: list[WrittenFile] = []
    for group in groups:
        if any(f.file_path in deleted for f in group):
            rows = read_live(table, [tasks[f.file_path] for f in group])
        else:
            rows = read_files(table, group)
        add.extend(table.write(rows, target_file_bytes=int(spec.target_file_mb * MB)))
    dropped = removable([d for f in remove for d in deleted.get(f.file_path, ())], remove)
    read_with = _deletes_of(deleted, remove)

    def attempt(number: int) -> Compaction:
        summary = restamped_summary(table, COMPACTION)
        files, deletes = live_files(table)
        live = {f.file_path for f in files}
        if not all(f.file_path in live for f in remove):
            log.warning("compaction of %s skipped: another writer removed some of its input files", table.identifier)
            return Compaction()
        if deletes and _deletes_now(table, remove) != read_with:
            log.warning(
                "compaction of %s skipped: rows of its input files were deleted since it read them (a changelog "
                "batch); run it again",
                table.identifier,
            )
            return Compaction()
        try:
            table.commit(Rewrite(remove, add, summary, dropped))
        except (CommitConflict, CommitUnknown):
            table.refresh()
            if not _landed(table, add):
                raise
        return Compaction(len(remove), len(add), delete_files_removed=len(dropped) or None)

    return with_retries(
        attempt,
        ATTEMPTS,
        lambda: CommitGaveUp(f"compaction of {table.identifier} kept conflicting with other writers; run again"),
        f"compaction commit on {table.identifier}",
    )


def _deletes_of(deleted: Mapping[str, Iterable[DataFile]], files: Sequence[DataFile]) -> dict[str, set[str]]:
    """Per file of ``files``, the delete files (by path) that apply to it."""
    return {f.file_path: {d.file_path for d in deleted.get(f.file_path, ())} for f in files}


def _deletes_now(table: IcebergTable, files: Sequence[DataFile]) -> dict[str, set[str]] | None:
    """:func:`_deletes_of` ``files`` on the head now (None: equality deletes apply now)."""
    try:
        return _deletes_of({path: task.delete_files for path, task in scan_tasks(table).items()}, files)
    except EqualityDeletes:
        return None


def _landed(table: IcebergTable, added: list[WrittenFile]) -> bool:
    live = {f.file_path for f in live_data_files(table)}
    return bool(added) and all(f.file_path in live for f in added)


def maintain(pipeline: Opened, now: float | None = None) -> Maintenance:
    spec = pipeline.config.maintenance
    now = time.time() if now is None else now
    # fail closed before touching a table whose ledger (or, with route_by, floor) is lost
    for table in [pipeline.rows, *routed_tables(pipeline).values()]:
        observe(table, pipeline.config.pipeline)
    # a batch's dead letters not added yet are files no snapshot references: add them before
    # orphan-file removal could take them for a crashed batch's
    found = observe(pipeline.rows, pipeline.config.pipeline)
    settle(
        pipeline.dead,
        pipeline.rows,
        pipeline.config,
        found.ledger if found else None,
        pipeline.config.commit.max_attempts,
    )

    def one(table: IcebergTable) -> TableMaintenance:
        compaction = compact(table, spec)
        expired = expire(table, spec, int(now * 1000))
        return TableMaintenance(compaction, len(expired), len(remove_orphans(table, spec, now)))

    # a routed table's floor is a ledger like the rows table's: compaction re-stamps it, expiry keeps it
    routed = {name: one(table) for name, table in routed_tables(pipeline).items()}
    return Maintenance(pipeline.config.pipeline, one(pipeline.rows), one(pipeline.dead), routed)
