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
import pyarrow.compute as pc
import pytest
from pyiceberg.types import StringType

from ingest.changes import KeyDeletes
from ingest.committer import RowsCommit, commit_rows
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition
from ingest.core.ledger_codec import find_ledger
from ingest.core.plan import Batch
from ingest.errors import CommitConflict, SchemaMoved, WrittenFilesGone
from ingest.iceberg.catalog import connect
from ingest.iceberg.files import live_data_files
from ingest.iceberg.layout import open_table
from ingest.iceberg.schema import rows_schema
from ingest.iceberg.table import IcebergTable
from ingest.intents import Append, DataFile, Expire, MoveRef, Reapply, RemoveRef, Rewrite, RowDelta
from ingest.ports import LedgerTable
from ingest.records import KAFKA_COLUMNS, Field
from ingest.testing.memory_table import MemoryCatalog

TP = TopicPartition("orders", 0)
Handles = Callable[[], LedgerTable]


@dataclass
class Table:
    """The table under test: new handles on it (new writers, on main or on a branch), its columns
    and offsets as a reader sees them, and what other tools do: ``ALTER TABLE … ADD COLUMN``, a
    ``DELETE``, snapshot expiry (``ingest maintain``'s, requiring the refs it saw), a branch."""

    handles: Handles
    columns: Callable[[], list[str]]
    alter: Callable[[str], None]
    on_branch: Callable[[str], LedgerTable]
    offsets: Callable[[str], list[int]]
    delete: Callable[[int, int], None]
    expire: Callable[[list[int]], None]
    branch: Callable[[str, int], None]
    #: the data files main's head references, as the table lists them (what a compaction removes)
    live: Callable[[], list[DataFile]]


@pytest.fixture(params=["memory", "iceberg"])
def table_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Table]:
    if request.param == "memory":
        memory = MemoryCatalog("contract.orders")

        def memory_offsets(branch: str) -> list[int]:
            data = memory.scan(branch)
            return sorted(data["_kafka_offset"].to_pylist()) if data is not None else []

        def memory_delete(lo: int, hi: int) -> None:
            memory.delete({}, lambda data: _between(data["_kafka_offset"], lo, hi))

        yield Table(
            memory.table,
            lambda: list(memory.schema),
            lambda name: memory.alter_schema(name),
            memory.table,
            memory_offsets,
            memory_delete,
            memory.expire,
            memory.set_ref,
            lambda: list(memory.live_files()),
        )
        return
    catalog = connect(
        {"name": "contract", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    )
    schema = rows_schema([])
    open_table(catalog, "contract.orders", schema)

    def alter(name: str) -> None:
        with catalog.load_table("contract.orders").update_schema() as update:
            update.add_column(name, StringType())

    def opened() -> IcebergTable:
        return open_table(catalog, "contract.orders", schema)

    def iceberg_offsets(branch: str) -> list[int]:
        table = opened()
        head = table.branch_head(branch)
        if head is None:
            return []
        return sorted(table.scan_columns(["_kafka_offset"], head)["_kafka_offset"].to_pylist())

    def delete(lo: int, hi: int) -> None:
        # a string, which pyiceberg parses into the same And(GreaterThanOrEqual, LessThan): mypy takes
        # those classes' constructors from their pydantic fields, not from the __init__ they define
        catalog.load_table("contract.orders").delete(f"_kafka_offset >= {lo} and _kafka_offset < {hi}")

    def expire(snapshot_ids: list[int]) -> None:
        opened().commit(Expire(snapshot_ids))

    def branch(name: str, snapshot_id: int) -> None:
        opened().commit(MoveRef(name, snapshot_id, expected=None))

    yield Table(opened, lambda: [f.name for f in catalog.load_table("contract.orders").schema().fields], alter,
                lambda name: opened().on_branch(name), iceberg_offsets, delete, expire, branch,
                lambda: list(live_data_files(opened())))  # fmt: skip


@pytest.fixture
def handles(table_under_test: Table) -> Handles:
    """A factory of new handles (new writers) on one empty table."""
    return table_under_test.handles


def _between(values: pa.ChunkedArray, lo: int, hi: int) -> pa.ChunkedArray:
    return pc.and_(pc.greater_equal(values, lo), pc.less(values, hi))


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
    first = table.commit(Append(files, {"ingest.test": "one"}, {"ingest.pipelines": "test"}))
    second = table.commit(Append([], {"ingest.test": "two"}))

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
    landed = theirs.commit(Append(theirs.write(rows(0, 5)), {"by": "them"}))
    with pytest.raises(CommitConflict):
        mine.commit(Append(mine.write(rows(0, 5)), {"by": "me"}))
    assert handles().refresh().snapshot_id == landed

    mine.refresh()
    after = mine.commit(Append([], {"by": "me"}))
    assert mine.head().snapshot_id == after
    reader = handles()
    reader.refresh()
    assert [s.summary.get("by") for s in reader.ancestry()] == ["me", "them"]


def test_a_young_view_is_kept_until_it_is_older_than_asked(handles: Handles) -> None:
    mine, theirs = handles(), handles()
    mine.refresh()
    theirs.refresh()
    landed = theirs.commit(Append([], {}))
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
        batch=1, offsets={TP: 10}, start_offsets={TP: 0}, cluster_id="c", origin={TP: 0}, read={TP: ((0, 10),)}
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


# --- what the state machines rely on beyond a commit: expiry, deletes, branches, files adopted --------


def _three_commits(table: LedgerTable) -> list[int]:
    table.refresh()
    return [table.commit(Append(table.write(rows(lo, lo + 5)), {"n": str(lo)})) for lo in (0, 5, 10)]


def test_after_expiry_the_walk_back_stops_at_the_expired_parent_and_later_snapshots_keep_their_rows(
    table_under_test: Table,
) -> None:
    first, second, third = _three_commits(table_under_test.handles())

    table_under_test.expire([second])

    reader = table_under_test.handles()
    reader.refresh()
    assert [s.snapshot_id for s in reader.ancestry()] == [third]  # its parent is gone: the chain ends
    assert [s.snapshot_id for s in reader.ancestry(first)] == [first]
    assert table_under_test.offsets("main") == list(range(15))  # the files of an expired snapshot stay


def test_another_writers_delete_is_a_snapshot_without_the_ledger_over_fewer_rows(table_under_test: Table) -> None:
    table = table_under_test.handles()
    table.refresh()
    batch = _batch(1, 0, 10)
    commit_rows(table, RowsCommit("orders", batch, batch.ledger(), table.write(rows(0, 10)), BatchCounts(), 3))

    table_under_test.delete(2, 4)  # rows of a file that keeps others: Iceberg rewrites the file
    table_under_test.delete(0, 100)  # every row left: the file goes whole

    reader = table_under_test.handles()
    reader.refresh()
    walk = list(reader.ancestry())
    assert [s.operation for s in walk] == ["delete", "overwrite", "append"]
    found = find_ledger("orders", walk)
    assert found is not None and found.snapshot_id == walk[2].snapshot_id
    assert table_under_test.offsets("main") == []


def test_a_branch_moves_apart_from_main_from_where_it_was_made(table_under_test: Table) -> None:
    first, _, third = _three_commits(table_under_test.handles())
    table_under_test.branch("replay-1", first)

    on_branch = table_under_test.on_branch("replay-1")
    on_branch.refresh()
    assert on_branch.head().snapshot_id == first
    landed = on_branch.commit(Append(on_branch.write(rows(100, 102)), {"n": "branch"}))

    assert [s.snapshot_id for s in on_branch.ancestry()] == [landed, first]
    assert table_under_test.offsets("replay-1") == [0, 1, 2, 3, 4, 100, 101]
    main = table_under_test.handles()
    assert main.refresh().snapshot_id == third and table_under_test.offsets("main") == list(range(15))


def test_files_written_earlier_are_adopted_by_path_and_a_file_gone_is_said(table_under_test: Table) -> None:
    writer = table_under_test.handles()
    writer.refresh()
    paths = [f.file_path for f in writer.write(rows(0, 4))]

    later = table_under_test.handles()  # another process, which knows only the paths
    later.refresh()
    adopted = later.adopt(paths)
    assert [f.record_count for f in adopted] == [4]
    later.commit(Append(adopted, {}))
    assert table_under_test.offsets("main") == [0, 1, 2, 3]
    with pytest.raises(WrittenFilesGone):
        later.adopt([paths[0].replace(".parquet", "-gone.parquet")])


# --- every commit intent, by compare-and-swap on what the handle read ------------------------------


def test_a_ref_moves_and_goes_only_from_where_the_handle_saw_it(table_under_test: Table) -> None:
    first, second, _ = _three_commits(table_under_test.handles())
    table = table_under_test.handles()
    table.refresh()
    table.commit(MoveRef("replay-1", first, expected=None))

    with pytest.raises(CommitConflict):  # it exists now: "create it" no longer holds
        table.commit(MoveRef("replay-1", second, expected=None))
    with pytest.raises(CommitConflict):
        table.commit(RemoveRef("replay-1", expected=second))
    table.commit(MoveRef("replay-1", second, expected=first))
    assert table_under_test.offsets("replay-1") == list(range(10))
    table.commit(RemoveRef("replay-1", expected=second))
    reader = table_under_test.handles()
    reader.refresh()
    assert reader.branch_head("replay-1") is None


def test_a_publish_moves_main_and_drops_the_branch_in_one_swap(table_under_test: Table) -> None:
    first, second, _ = _three_commits(table_under_test.handles())
    table = table_under_test.handles()
    table.refresh()
    table.commit(MoveRef("replay-1", second, expected=None))
    main = table.branch_head("main")

    with pytest.raises(CommitConflict):  # the branch moved on since: neither ref changes
        table.commit(MoveRef("main", first, expected=main, drop="replay-1"))
    table.refresh()
    assert table.branch_head("main") == main and table.branch_head("replay-1") == second
    table.commit(MoveRef("main", second, expected=main, drop="replay-1"))
    reader = table_under_test.handles()
    reader.refresh()
    assert reader.branch_head("main") == second and reader.branch_head("replay-1") is None


def test_a_rewrite_replaces_files_by_the_same_rows_on_the_head_it_read(table_under_test: Table) -> None:
    writer = table_under_test.handles()
    writer.refresh()
    writer.commit(Append(writer.write(rows(0, 5)), {}))
    files = table_under_test.live()
    stale = table_under_test.handles()
    stale.refresh()
    writer.commit(Append(writer.write(rows(5, 10)), {}))

    with pytest.raises(CommitConflict):  # the head moved since it read it
        stale.commit(Rewrite(files, stale.write(rows(0, 5)), {"ingest.maintenance": "compaction"}))
    stale.refresh()
    rewritten = stale.commit(Rewrite(files, stale.write(rows(0, 5)), {"ingest.maintenance": "compaction"}))

    assert stale.head().snapshot_id == rewritten
    assert table_under_test.offsets("main") == list(range(10))


def test_reapply_of_a_snapshot_expired_since_it_was_listed_conflicts_and_adds_nothing(table_under_test: Table) -> None:
    first, second, _ = _three_commits(table_under_test.handles())
    table_under_test.branch("replay-1", first)
    table_under_test.expire([second])  # `ingest maintain` between the carry-over's listing and its commit
    on_branch = table_under_test.on_branch("replay-1")
    on_branch.refresh()

    with pytest.raises(CommitConflict):
        on_branch.commit(Reapply(second, {"ingest.reapplied-from": str(second)}))
    assert table_under_test.offsets("replay-1") == list(range(5))


def key_rows(*offsets: int) -> pa.Table:
    return pa.table({"_kafka_partition": pa.array([0] * len(offsets), pa.int32()), "_kafka_offset": offsets})


KEY = ("_kafka_partition", "_kafka_offset")


def test_a_row_delta_deletes_the_live_rows_of_its_keys_and_adds_its_rows_in_one_snapshot(
    table_under_test: Table,
) -> None:
    writer = table_under_test.handles()
    writer.refresh()
    writer.commit(Append(writer.write(rows(0, 5)), {}))
    writer.commit(Append(writer.write(rows(5, 10)), {}))

    # keys 3 and 7 (in two files) and 12 (in none) change: 3 and 12 have new rows, 7 is deleted
    upserted = writer.commit(
        RowDelta(writer.write(pa.concat_tables([rows(3, 4), rows(12, 13)])), KEY, key_rows(3, 7, 12), {"n": "1"})
    )
    assert table_under_test.offsets("main") == [0, 1, 2, 3, 4, 5, 6, 8, 9, 12]
    assert next(writer.ancestry()).summary.get("n") == "1" and writer.head().snapshot_id == upserted

    # a key whose row is deleted already, and one whose row a row delta added: each row goes once
    writer.commit(RowDelta([], KEY, key_rows(7, 3), {"n": "2"}))
    assert table_under_test.offsets("main") == [0, 1, 2, 4, 5, 6, 8, 9, 12]
    writer.commit(RowDelta(writer.write(rows(7, 8)), KEY, key_rows(7), {"n": "3"}))
    assert table_under_test.offsets("main") == [0, 1, 2, 4, 5, 6, 7, 8, 9, 12]


def test_a_row_delta_decides_its_rows_on_the_head_it_requires(table_under_test: Table) -> None:
    writer = table_under_test.handles()
    writer.refresh()
    writer.commit(Append(writer.write(rows(0, 5)), {}))
    stale = table_under_test.handles()
    stale.refresh()
    writer.commit(Append(writer.write(rows(2, 3)), {}))  # another copy of key 2 since

    with pytest.raises(CommitConflict):  # nothing applied: the head moved since it read it
        stale.commit(RowDelta(stale.write(rows(2, 3)), KEY, key_rows(2), {}))
    assert table_under_test.offsets("main") == [0, 1, 2, 2, 3, 4]
    stale.refresh()
    stale.commit(RowDelta(stale.write(rows(2, 3)), KEY, key_rows(2), {}))
    assert table_under_test.offsets("main") == [0, 1, 2, 3, 4]


def test_a_changelog_batch_landed_by_a_racing_copy_is_not_applied_again(table_under_test: Table) -> None:
    """Two copies commit the same changelog batch (planned on one ledger): the first's row delta
    lands with the ledger, the second finds its batch landed and applies nothing (were it applied,
    it would delete the first's new rows of its keys and add its own: the same rows, but two
    snapshots of one batch)."""
    writer = table_under_test.handles()
    writer.refresh()
    first = _batch(1, 0, 10)
    commit_rows(writer, RowsCommit("orders", first, first.ledger(), writer.write(rows(0, 10)), BatchCounts(), 3))
    one, other = table_under_test.handles(), table_under_test.handles()
    one.refresh()
    other.refresh()
    second = _batch(2, 10, 12, base=first.ledger())
    deletes = KeyDeletes(KEY, key_rows(3, 7, 12))

    def request(table: LedgerTable) -> RowsCommit:
        files = table.write(pa.concat_tables([rows(3, 4), rows(12, 13)]))
        return RowsCommit("orders", second, second.ledger(), files, BatchCounts(), 3, deletes=deletes)

    landed = commit_rows(one, request(one))
    again = commit_rows(other, request(other))

    assert (landed.decision, again.decision) == (Decision.COMMIT, Decision.LANDED)
    assert again.snapshot_id == landed.snapshot_id
    assert table_under_test.offsets("main") == [0, 1, 2, 3, 4, 5, 6, 8, 9, 12]


def test_reapply_adds_again_on_a_branch_the_files_a_snapshot_of_main_added(table_under_test: Table) -> None:
    first, _, third = _three_commits(table_under_test.handles())
    table_under_test.branch("replay-1", first)
    on_branch = table_under_test.on_branch("replay-1")
    on_branch.refresh()

    landed = on_branch.commit(Reapply(third, {"ingest.reapplied-from": str(third)}))

    assert table_under_test.offsets("replay-1") == [*range(5), *range(10, 15)]
    assert next(on_branch.ancestry()).summary.get("ingest.reapplied-from") == str(third)
    assert on_branch.head().snapshot_id == landed
