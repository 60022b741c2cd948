"""An append is built on the branch head alone (pyiceberg re-derives the whole metadata on every read
inside a transaction) and applied by the catalog to its complete metadata: nothing else in the
table may change — other branches, tags, older snapshots, the snapshot and metadata logs, and the
summary totals that readers use. The SQL catalog parses a metadata file once, and still sees every
other writer's commit.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.serializers import FromInputFile

from ingest.assembly import open_pipeline
from ingest.iceberg.held_catalog import HeldSqlCatalog
from tests.integration.conftest import MakeEnv
from tests.runs import one_batch

pytestmark = [pytest.mark.integration, pytest.mark.catalog_race]


def test_append_keeps_refs_snapshots_logs_and_totals(make_env: MakeEnv) -> None:
    env = make_env(batch={"max_records": 400})
    env.produce(1_200)
    pipeline = open_pipeline(env.config)
    for _ in range(3):
        assert one_batch(pipeline).status == "committed"
    before = pipeline.rows.refresh().snapshot_id
    first, second = (s.snapshot_id for s in pipeline.rows.table.metadata.snapshots[:2])
    pipeline.rows.table.manage_snapshots().create_tag(first, "audit").create_branch(second, "replay-x").commit()
    pipeline.rows.refresh()
    metadata = pipeline.rows.table.metadata
    old_snapshots = [s.snapshot_id for s in metadata.snapshots]
    old_log = [e.snapshot_id for e in metadata.snapshot_log]
    old_metadata_log = len(metadata.metadata_log)

    env.produce(400)
    result = one_batch(pipeline)

    assert result.status == "committed"
    metadata = pipeline.rows.table.metadata  # what the commit returned: the catalog's metadata
    reloaded = open_pipeline(env.config).rows.table.metadata
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


def test_the_sql_catalog_parses_each_metadata_file_once_and_sees_other_writers(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(batch={"max_records": 400})
    env.produce(800)
    pipeline = open_pipeline(env.config)
    assert isinstance(pipeline.rows.catalog, HeldSqlCatalog)
    assert one_batch(pipeline).status == "committed"
    parsed: list[str] = []
    parse = FromInputFile.table_metadata

    def counting(input_file: Any, encoding: str = "utf-8") -> Any:
        parsed.append(input_file.location)
        return parse(input_file, encoding)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counting))

    # planning's refresh and the commit's own check find the metadata this handle committed last
    assert one_batch(pipeline).status == "committed"
    assert parsed == []
    held = pipeline.rows.table
    assert pipeline.rows.catalog.load_table(held.name()).metadata is held.metadata

    # another writer, through pyiceberg's own catalog: its commit is seen by the next load
    properties = dict(env.config.catalog)
    other = load_catalog(properties.pop("name"), **properties).load_table(held.name())
    assert type(other.catalog) is not HeldSqlCatalog
    other.transaction().set_properties({"owner": "someone else"}).commit_transaction()
    parsed.clear()
    assert pipeline.rows.refresh().properties["owner"] == "someone else"
    assert parsed == [other.metadata_location]
    env.produce(400)
    assert one_batch(pipeline).status == "committed"  # committed on top of the other writer's change
    assert pipeline.rows.table.properties["owner"] == "someone else"
    assert env.counts() == (1_200, 0)
    env.verify()
