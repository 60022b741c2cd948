"""``ingest replay``: re-ingest everything after snapshot S from Kafka, with no duplicates or gaps.

Default (non-destructive): a branch ``replay-<S>`` is created at S and batches are committed to it
until caught up; the report compares it with main. ``publish`` then moves main to the branch head
with a compare-and-swap on main's head: it is refused if main moved in between, after which the
branch catches up again and the swap is retried. ``rollback`` instead points main back at S, and the
normal runs continue from S's ledger. Before anything changes, the replay checks that Kafka still
holds every record after S's ledger and fails naming the missing ranges if not.

Dead letters stay on the main dead-letter table: its ledger is a floor below which every dead
letter is already stored, so re-read ranges add none twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from ingest.committer import observe
from ingest.core.ledger import Found, find_ledger
from ingest.errors import ConfigError, FatalError, RetryableError
from ingest.iceberg import CommitConflict, IcebergTable
from ingest.pipeline import Pipeline

PUBLISH_ATTEMPTS = 5


class ReplayImpossible(FatalError):
    """Kafka no longer holds records the replay would need."""


def resolve_snapshot(table: IcebergTable, snapshot_id: int | None, as_of_ms: int | None) -> int:
    if snapshot_id is None:
        assert as_of_ms is not None
        found = table.snapshot_as_of(as_of_ms)
        if found is None:
            raise ConfigError(f"--as-of: main has no snapshot at or before {as_of_ms} ms")
        return found
    if table.snapshot_summary(snapshot_id) is None:
        raise ConfigError(f"--from-snapshot: table {table.identifier} has no snapshot {snapshot_id}")
    return snapshot_id


def _rows_per_partition(table: IcebergTable, branch_snapshot: int | None) -> Counter[tuple[str, int]]:
    if branch_snapshot is None:
        return Counter()
    data: pa.Table = table.scan_columns(["_kafka_topic", "_kafka_partition"], branch_snapshot)
    counts = data.group_by(["_kafka_topic", "_kafka_partition"]).aggregate([([], "count_all")]).to_pylist()
    return Counter({(r["_kafka_topic"], r["_kafka_partition"]): r["count_all"] for r in counts})


def compare(pipeline: Pipeline, branch: str) -> list[dict[str, Any]]:
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
    return [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            "main_offset": main_ledger.ledger.offsets.get(tp) if main_ledger else None,
            "branch_offset": branch_ledger.ledger.offsets.get(tp) if branch_ledger else None,
            "main_rows": main_rows[(tp.topic, tp.partition)],
            "branch_rows": branch_rows[(tp.topic, tp.partition)],
        }
        for tp in tps
    ]


def _check_retained(pipeline: Pipeline, start: Found) -> None:
    view = pipeline.source.describe()
    missing = [
        f"{tp} [{offset}, {view.partitions[tp].low})"
        for tp, offset in sorted(start.ledger.offsets.items())
        if tp in view.partitions and offset < view.partitions[tp].low
    ]
    if missing:
        raise ReplayImpossible(
            f"replay from snapshot {start.snapshot_id} refused: Kafka no longer holds offsets {', '.join(missing)} "
            "(deleted by retention). Nothing was changed. Replay from a later snapshot."
        )


def replay(
    pipeline: Pipeline,
    snapshot_id: int | None = None,
    as_of_ms: int | None = None,
    publish: bool = False,
    rollback: bool = False,
) -> dict[str, Any]:
    name = pipeline.config.pipeline
    rows = pipeline.rows
    rows.refresh()
    target = resolve_snapshot(rows, snapshot_id, as_of_ms)
    start = find_ledger(name, rows.ancestry(target))
    if start is None:
        raise ConfigError(
            f"snapshot {target} has no ledger of pipeline {name!r} in its ancestry; nothing to replay from"
        )
    _check_retained(pipeline, start)
    report: dict[str, Any] = {"pipeline": name, "from_snapshot": target, "ledger_batch": start.ledger.batch}
    if rollback:
        rows.set_main(target)
        report |= {"action": "rolled-back", "main": target}
        return report
    branch = f"replay-{target}"
    if rows.branch_head(branch) is None:
        try:
            rows.create_branch(branch, target)
        except CommitConflict:  # a concurrent copy of this command created it
            rows.refresh()
    replaying = pipeline.on_branch(branch)
    batches = [r.as_dict() for r in replaying.run(until_caught_up=True, max_batches=None)]
    report |= {"action": "replayed", "branch": branch, "batches": batches}
    if publish:
        report["published"] = _publish(pipeline, replaying, branch)
        report["action"] = "published"
    report["comparison"] = compare(pipeline, branch)
    return report


def _publish(pipeline: Pipeline, replaying: Pipeline, branch: str) -> int:
    """Move main to the branch head once the branch holds at least everything main holds."""
    name = pipeline.config.pipeline
    for _ in range(PUBLISH_ATTEMPTS):
        main = observe(pipeline.rows, name)  # refreshes: the swap requires this main head
        head = replaying.rows.branch_head(branch)
        replayed = find_ledger(name, pipeline.rows.ancestry(head)) if head is not None else None
        behind = main is not None and (
            replayed is None
            or any(replayed.ledger.offsets.get(tp, -1) < offset for tp, offset in main.ledger.offsets.items())
        )
        if not behind and head is not None:
            try:
                pipeline.rows.set_main(head)
                return head
            except CommitConflict:
                pass  # main moved in between: catch up again
        for _result in replaying.run(until_caught_up=True, max_batches=None):
            pass
    raise RetryableError(
        f"publish of {branch} refused {PUBLISH_ATTEMPTS} times: main keeps moving. The branch is caught up "
        "and intact; pause the scheduled runs of this pipeline and run the replay with --publish again."
    )
