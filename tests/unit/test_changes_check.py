"""A changelog table judged against the fold of its changes."""

from __future__ import annotations

import pyarrow as pa

from ingest.changes import DELETE, OP, UPSERT
from ingest.changes_check import judge


def changes(*items: tuple[int, int, str]) -> pa.Table:
    """(key, offset, op) in partition 0 of topic t."""
    return pa.table(
        {
            "id": [k for k, _, _ in items],
            "_kafka_topic": ["t"] * len(items),
            "_kafka_partition": pa.array([0] * len(items), pa.int32()),
            "_kafka_offset": pa.array([o for _, o, _ in items], pa.int64()),
            OP: [op for _, _, op in items],
        }
    )


def rows(*items: tuple[int, int]) -> pa.Table:
    return changes(*((k, o, UPSERT) for k, o in items)).drop_columns([OP])


def offsets(table: pa.Table) -> list[int]:
    return [int(o) for o in table["_kafka_offset"].to_pylist()]


CHANGES = changes((1, 10, UPSERT), (2, 11, UPSERT), (1, 12, UPSERT), (2, 13, DELETE), (3, 14, UPSERT))


def in_range(table: pa.Table) -> pa.Array:
    return pa.compute.greater_equal(table["_kafka_offset"], 10)


def test_a_table_that_is_the_fold_of_its_changes_is_ok() -> None:
    table = rows((1, 12), (3, 14), (7, 3))  # key 7: changed before the checked ranges
    assert judge(CHANGES, table, in_range(table), ["id"]).ok


def test_each_way_a_table_differs_from_the_fold_is_named() -> None:
    table = rows((1, 10), (2, 11), (7, 3), (7, 4), (8, 15))
    found = judge(CHANGES, table, in_range(table), ["id"])
    assert not found.ok
    assert offsets(found.missing) == [14]  # key 3's upsert has no row
    assert offsets(found.stale) == [10]  # key 1's row is not its last change's
    assert offsets(found.undeleted) == [11]  # key 2 was deleted
    assert offsets(found.duplicated) == [3, 4]  # key 7 twice
    assert offsets(found.unexpected) == [15]  # no change of key 8 at offset 15
