"""An append is built on the branch head alone (pyiceberg re-derives the whole metadata on every read
inside a transaction) and applied by the catalog to its complete metadata: nothing else in the
table may change — other branches, tags, older snapshots, the snapshot and metadata logs, and the
summary totals that readers use.
"""

from __future__ import annotations

import pytest

from ingest.pipeline import Pipeline

pytestmark = pytest.mark.integration


def test_append_keeps_refs_snapshots_logs_and_totals(make_env) -> None:
    env = make_env(batch={"max_records": 400})
    env.produce(1_200)
    pipeline = Pipeline.open(env.config)
    for _ in range(3):
        assert pipeline.run_batch().status == "committed"
    before = pipeline.rows.refresh().snapshot_id
    first, second = (s.snapshot_id for s in pipeline.rows.table.metadata.snapshots[:2])
    pipeline.rows.table.manage_snapshots().create_tag(first, "audit").create_branch(second, "replay-x").commit()
    pipeline.rows.refresh()
    metadata = pipeline.rows.table.metadata
    old_snapshots = [s.snapshot_id for s in metadata.snapshots]
    old_log = [e.snapshot_id for e in metadata.snapshot_log]
    old_metadata_log = len(metadata.metadata_log)

    env.produce(400)
    result = pipeline.run_batch()

    assert result.status == "committed"
    metadata = pipeline.rows.table.metadata  # what the commit returned: the catalog's metadata
    reloaded = Pipeline.open(env.config).rows.table.metadata
    for seen in (metadata, reloaded):
        assert [s.snapshot_id for s in seen.snapshots] == [*old_snapshots, result.snapshot_id]
        assert seen.refs["audit"].snapshot_id == first and seen.refs["audit"].snapshot_ref_type == "tag"
        assert seen.refs["replay-x"].snapshot_id == second
        assert seen.refs["main"].snapshot_id == result.snapshot_id
        assert [e.snapshot_id for e in seen.snapshot_log] == [*old_log, result.snapshot_id]
        assert len(seen.metadata_log) == old_metadata_log + 1
        head = seen.snapshot_by_id(result.snapshot_id)
        assert head is not None and head.parent_snapshot_id == before
        assert head.summary is not None and head.summary["total-records"] == "1600"
        assert head.sequence_number == max(s.sequence_number for s in seen.snapshots if s.sequence_number)
    assert env.counts() == (1_600, 0)
    env.verify()
