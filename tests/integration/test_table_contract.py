"""The ledger-table contract (:class:`ingest.ports.LedgerTable`), run against both of its adapters:
the in-memory table the protocol's state machine drives (:mod:`ingest.testing`) and the real
Iceberg table on a SQLite catalog. What the state machine proves on the memory table holds for
Iceberg only as far as the two behave alike here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.types import StringType

from ingest.committer import RowsCommit, commit_rows
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition, find_ledger
from ingest.core.plan import Batch
from ingest.errors import CommitConflict, SchemaMoved
from ingest.iceberg.catalog import connect
from ingest.iceberg.schema import rows_schema
from ingest.iceberg.table import IcebergTable
from ingest.ports import LedgerTable
from ingest.records import KAFKA_COLUMNS, Field
from ingest.testing import MemoryCatalog

TP = TopicPartition("orders", 0)
Handles = Callable[[], LedgerTable]


@dataclass
class Table:
    """The table under test: new handles on it (new writers), its columns as a reader sees them,
    and another tool's ``ALTER TABLE … ADD COLUMN``."""

    handles: Handles
    columns: Callable[[], list[str]]
    alter: Callable[[str], None]


@pytest.fixture(params=["memory", "iceberg"])
def table_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Table]:
    if request.param == "memory":
        memory = MemoryCatalog("contract.orders")
        yield Table(memory.table, lambda: list(memory.schema), lambda name: memory.alter_schema(name))
        return
    catalog = connect(
        {"name": "contract", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    )
    schema = rows_schema([])
    IcebergTable.open(catalog, "contract.orders", schema)

    def alter(name: str) -> None:
        with catalog.load_table("contract.orders").update_schema() as update:
            update.add_column(name, StringType())

    yield Table(
        lambda: IcebergTable.open(catalog, "contract.orders", schema),
        lambda: [f.name for f in catalog.load_table("contract.orders").schema().fields],
        alter,
    )


@pytest.fixture
def handles(table_under_test: Table) -> Handles:
    """A factory of new handles (new writers) on one empty table."""
    return table_under_test.handles


def rows(start: int, end: int) -> pa.Table:
    n = end - start
    return pa.table(
        {
            "_kafka_topic": pa.array(["orders"] * n, pa.string()),
            "_kafka_partition": pa.array([0] * n, pa.int32()),
            "_kafka_offset": pa.array(range(start, end), pa.int64()),
            "_kafka_timestamp": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
            "_kafka_key": pa.array([None] * n, pa.binary()),
        },
        schema=KAFKA_COLUMNS,
    )


def test_a_new_table_has_no_head_and_no_history(handles: Handles) -> None:
    table = handles()
    assert table.refresh().snapshot_id is None
    assert list(table.ancestry()) == []


def test_a_commit_moves_the_head_and_carries_its_summary_and_properties(handles: Handles) -> None:
    table = handles()
    table.refresh()
    files = table.write(rows(0, 10))
    assert sum(f.record_count for f in files) == 10
    first = table.try_commit(files, {"ingest.test": "one"}, {"ingest.pipelines": "test"})
    second = table.try_commit([], {"ingest.test": "two"}, {})

    reader = handles()
    head = reader.refresh()
    assert head.snapshot_id == second
    assert head.properties["ingest.pipelines"] == "test"
    assert [(s.snapshot_id, s.summary.get("ingest.test")) for s in reader.ancestry()] == [
        (second, "two"),
        (first, "one"),
    ]
    assert [s.snapshot_id for s in reader.ancestry(first)] == [first]


def test_a_commit_on_a_moved_head_conflicts_and_changes_nothing(handles: Handles) -> None:
    mine, theirs = handles(), handles()
    mine.refresh()
    theirs.refresh()
    landed = theirs.try_commit(theirs.write(rows(0, 5)), {"by": "them"}, {})
    with pytest.raises(CommitConflict):
        mine.try_commit(mine.write(rows(0, 5)), {"by": "me"}, {})
    assert handles().refresh().snapshot_id == landed

    mine.refresh()
    after = mine.try_commit([], {"by": "me"}, {})
    assert mine.head().snapshot_id == after
    reader = handles()
    reader.refresh()
    assert [s.summary.get("by") for s in reader.ancestry()] == ["me", "them"]


def test_a_young_view_is_kept_until_it_is_older_than_asked(handles: Handles) -> None:
    mine, theirs = handles(), handles()
    mine.refresh()
    theirs.refresh()
    landed = theirs.try_commit([], {}, {})
    assert mine.refresh(max_age_s=math.inf).snapshot_id is None  # what the handle holds
    assert mine.refresh(max_age_s=0.0).snapshot_id == landed


def test_the_commit_loop_commits_once_finds_a_landed_batch_and_is_fenced_by_another(handles: Handles) -> None:
    table = handles()
    batch = Batch(number=1, base=None, start={TP: 0}, end={TP: 10}, cluster_id="c")
    request = RowsCommit("orders", batch, batch.ledger(), table.write(rows(0, 10)), BatchCounts(records=10), 3)

    assert commit_rows(table, request).decision is Decision.COMMIT
    # the same batch again (a retry whose first acknowledgement was lost) finds it landed
    again = commit_rows(handles(), request)
    assert again.decision is Decision.LANDED
    # a batch planned from no ledger with another end is fenced by the one that landed
    other = Batch(number=1, base=None, start={TP: 0}, end={TP: 5}, cluster_id="c")
    fenced = RowsCommit("orders", other, other.ledger(), [], BatchCounts(), 3)
    assert commit_rows(handles(), fenced).decision is Decision.FENCED

    reader = handles()
    reader.refresh()
    found = find_ledger("orders", reader.ancestry())
    assert found is not None and found.ledger == Ledger(
        batch=1, offsets={TP: 10}, start_offsets={TP: 0}, cluster_id="c", origin={TP: 0}
    )
    assert sum(1 for _ in reader.ancestry()) == 1


NOTE = [Field("note", "string")]


def with_note(start: int, end: int) -> pa.Table:
    data = rows(start, end)
    return data.append_column("note", pa.array([f"n{i}" for i in range(start, end)], pa.string()))


def _batch(number: int, start: int, end: int, base: Ledger | None = None) -> Batch:
    return Batch(number=number, base=base, start={TP: start}, end={TP: end}, cluster_id="c")


def test_an_evolution_goes_into_the_next_commit_with_its_data_never_alone(table_under_test: Table) -> None:
    table = table_under_test.handles()
    table.refresh()
    table.evolve_to(NOTE)
    files = table.write(with_note(0, 5))
    assert "note" not in table_under_test.columns()  # staged, not applied

    batch = _batch(1, 0, 5)
    request = RowsCommit("orders", batch, batch.ledger(), files, BatchCounts(records=5), 3)
    assert commit_rows(table, request).decision is Decision.COMMIT
    assert "note" in table_under_test.columns()
    reader = table_under_test.handles()
    reader.refresh()
    assert sum(1 for _ in reader.ancestry()) == 1  # one snapshot: the data, the ledger and the schema

    # a copy of the same config, which planned before the evolution landed, evolves to the same schema
    copy = table_under_test.handles()
    copy.evolve_to(NOTE)
    second = _batch(2, 5, 9, batch.ledger())
    files = copy.write(with_note(5, 9))
    outcome = commit_rows(copy, RowsCommit("orders", second, second.ledger(), files, BatchCounts(records=4), 3))
    assert outcome.decision is Decision.COMMIT
    assert table_under_test.columns().count("note") == 1


def test_files_written_for_an_evolution_another_tool_overtook_are_never_committed(table_under_test: Table) -> None:
    table = table_under_test.handles()
    table.refresh()
    table.evolve_to(NOTE)
    files = table.write(with_note(0, 5))
    table_under_test.alter("other")  # takes the field id the files were written with

    batch = _batch(1, 0, 5)
    with pytest.raises(SchemaMoved):
        commit_rows(table, RowsCommit("orders", batch, batch.ledger(), files, BatchCounts(records=5), 3))
    reader = table_under_test.handles()
    assert reader.refresh().snapshot_id is None
    assert "note" not in table_under_test.columns() and "other" in table_under_test.columns()
