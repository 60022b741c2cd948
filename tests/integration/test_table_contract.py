"""The ledger-table contract (:class:`ingest.ports.LedgerTable`), run against both of its adapters:
the in-memory table the protocol's state machine drives (:mod:`ingest.testing`) and the real
Iceberg table on a SQLite catalog. What the state machine proves on the memory table holds for
Iceberg only as far as the two behave alike here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.committer import RowsCommit, commit_rows
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition, find_ledger
from ingest.core.plan import Batch
from ingest.errors import CommitConflict
from ingest.iceberg.catalog import connect
from ingest.iceberg.schema import rows_schema
from ingest.iceberg.table import IcebergTable
from ingest.ports import LedgerTable
from ingest.records import KAFKA_COLUMNS
from ingest.testing import MemoryCatalog

TP = TopicPartition("orders", 0)
Handles = Callable[[], LedgerTable]


@pytest.fixture(params=["memory", "iceberg"])
def handles(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Handles]:
    """A factory of new handles (new writers) on one empty table."""
    if request.param == "memory":
        memory = MemoryCatalog("contract.orders")
        yield memory.table
        return
    catalog = connect(
        {"name": "contract", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    )
    schema = rows_schema([])
    IcebergTable.open(catalog, "contract.orders", schema)
    yield lambda: IcebergTable.open(catalog, "contract.orders", schema)


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
        batch=1, offsets={TP: 10}, start_offsets={TP: 0}, cluster_id="c"
    )
    assert sum(1 for _ in reader.ancestry()) == 1
