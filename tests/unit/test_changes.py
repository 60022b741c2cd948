"""The changelog fold (:mod:`ingest.changes`) against a model: a dict from key to row, applied
change by change in offset order of each partition."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from ingest.changes import DELETE, OP, UPSERT, fold, from_debezium, from_tombstones, from_upserts
from ingest.records import ROWS

#: (partition, key part a, key part b, upsert?) per change, in the order a batch reads them
Change = tuple[int, int, str, bool]
CHANGES = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from("xy"), st.booleans()), max_size=40)


def as_table(changes: list[Change], first_offset: int = 0) -> pa.Table:
    """``changes`` as decoded: offsets ascending in each partition, in the order given (a batch's
    tasks may hand them over partition by partition or interleaved)."""
    next_offset: dict[int, int] = {}
    offsets = []
    for partition, *_ in changes:
        offsets.append(next_offset.get(partition, first_offset))
        next_offset[partition] = offsets[-1] + 1
    return pa.table(
        {
            "a": pa.array([c[1] for c in changes], pa.int64()),
            "b": pa.array([c[2] for c in changes], pa.string()),
            "v": pa.array([f"{i}" if c[3] else None for i, c in enumerate(changes)], pa.string()),
            OP: pa.array([UPSERT if c[3] else DELETE for c in changes], pa.string()),
            ROWS.partition: pa.array([c[0] for c in changes], pa.int32()),
            ROWS.offset: pa.array(offsets, pa.int64()),
        }
    )


def model(changes: pa.Table) -> dict[tuple[int, str], str | None]:
    """Per key, the value of its last change (None: deleted), changes applied in partition then offset order."""
    rows = changes.to_pylist()
    state: dict[tuple[int, str], str | None] = {}
    for row in sorted(rows, key=lambda r: (r[ROWS.partition], r[ROWS.offset])):
        state[(row["a"], row["b"])] = row["v"] if row[OP] == UPSERT else None
    return state


@given(CHANGES)
def test_a_batch_lands_each_keys_last_change_and_deletes_every_key_it_touches(changes: list[Change]) -> None:
    table = as_table(changes)
    folded = fold(table, ["a", "b"])
    expected = model(table)

    landed = table.take(folded.rows)
    assert {(r["a"], r["b"]): r["v"] for r in landed.to_pylist()} == {k: v for k, v in expected.items() if v}
    assert landed.num_rows == len({k for k, v in expected.items() if v})  # one row per key
    assert sorted(zip(folded.keys["a"].to_pylist(), folded.keys["b"].to_pylist(), strict=True)) == sorted(expected)
    assert folded.rows.to_pylist() == sorted(folded.rows.to_pylist())


#: changes whose key decides their partition, as a keyed producer's partitioner does
KEYED = CHANGES.map(lambda changes: [((a + ord(b)) % 3, a, b, upsert) for _, a, b, upsert in changes])


@given(KEYED, KEYED)
def test_two_batches_committed_one_after_the_other_leave_the_fold_of_all_their_changes(
    first: list[Change], second: list[Change]
) -> None:
    """A table committed batch by batch (each deletes the live rows of its keys, then adds its
    rows) holds, for every key, the image of its newest change: what one batch of both would."""
    one, two = as_table(first), as_table(second, first_offset=100)
    table: dict[tuple[int, str], str] = {}
    for batch in (one, two):
        folded = fold(batch, ["a", "b"])
        for a, b in zip(folded.keys["a"].to_pylist(), folded.keys["b"].to_pylist(), strict=True):
            table.pop((a, b), None)
        for row in batch.take(folded.rows).to_pylist():
            assert (row["a"], row["b"]) not in table, "a key twice in the table"
            table[(row["a"], row["b"])] = row["v"]

    both = model(pa.concat_tables([one, two]))
    assert table == {k: v for k, v in both.items() if v is not None}


def test_an_empty_batch_changes_nothing() -> None:
    folded = fold(as_table([]), ["a", "b"])
    assert folded.rows.to_pylist() == [] and folded.keys.num_rows == 0


ROW = pa.struct([("id", pa.int64()), ("name", pa.string())])


def events(*changes: tuple[str | None, dict[str, object] | None, dict[str, object] | None]) -> pa.Table:
    """Decoded Debezium events ``(op, before, after)`` at offsets 0, 1, … of partition 0."""
    n = len(changes)
    return pa.table(
        {
            ROWS.partition: pa.array([0] * n, pa.int32()),
            ROWS.offset: pa.array(range(n), pa.int64()),
            "before": pa.array([c[1] for c in changes], ROW),
            "after": pa.array([c[2] for c in changes], ROW),
            "op": pa.array([c[0] for c in changes], pa.string()),
        }
    )


def test_debezium_creates_reads_and_updates_upsert_the_after_image_and_deletes_delete_the_before_key() -> None:
    changes, bad = from_debezium(
        events(
            ("r", None, {"id": 1, "name": "snapshot"}),
            ("c", None, {"id": 2, "name": "new"}),
            ("u", {"id": 1, "name": "snapshot"}, {"id": 1, "name": "renamed"}),
            ("d", {"id": 2, "name": "new"}, None),
        ),
        ["id"],
    )
    assert bad == {}
    as_rows = sorted(changes.select([ROWS.offset, "id", "name", OP]).to_pylist(), key=lambda r: r[ROWS.offset])
    assert as_rows == [
        {ROWS.offset: 0, "id": 1, "name": "snapshot", OP: UPSERT},
        {ROWS.offset: 1, "id": 2, "name": "new", OP: UPSERT},
        {ROWS.offset: 2, "id": 1, "name": "renamed", OP: UPSERT},
        {ROWS.offset: 3, "id": 2, "name": None, OP: DELETE},  # only the key of a delete
    ]
    folded = fold(changes, ["id"])
    assert changes.take(folded.rows).select(["id", "name"]).to_pylist() == [{"id": 1, "name": "renamed"}]


def test_an_update_that_changes_the_key_deletes_the_old_key_and_upserts_the_new() -> None:
    changes, bad = from_debezium(
        events(("c", None, {"id": 1, "name": "a"}), ("u", {"id": 1, "name": "a"}, {"id": 7, "name": "a"})), ["id"]
    )
    assert bad == {}
    folded = fold(changes, ["id"])
    assert sorted(folded.keys["id"].to_pylist()) == [1, 7]
    assert changes.take(folded.rows).select(["id", "name"]).to_pylist() == [{"id": 7, "name": "a"}]


def test_an_event_that_is_no_change_of_a_keyed_row_says_why_and_the_rest_are_changes() -> None:
    changes, bad = from_debezium(
        events(
            ("t", None, None),
            ("u", {"id": 1, "name": "x"}, None),
            ("d", None, None),
            ("c", None, {"id": None, "name": "no key"}),
            (None, None, {"id": 3, "name": "no op"}),
            ("c", None, {"id": 4, "name": "fine"}),
        ),
        ["id"],
    )
    assert bad == {
        0: "Debezium op 't' is not a change of a row (c, r, u, d)",
        1: "Debezium op 'u' without the 'after' image",
        2: "Debezium op 'd' without the 'before' image",
        3: "key column 'id' is null in the 'after' image",
        4: "Debezium op None is not a change of a row (c, r, u, d)",
    }
    assert changes.select(["id", OP]).to_pylist() == [{"id": 4, OP: UPSERT}]


def test_an_upsert_topics_values_are_upserts_and_its_tombstones_delete_the_key_they_name() -> None:
    row = pa.schema([("id", pa.int64()), ("name", pa.string())])
    values = pa.table(
        {ROWS.offset: pa.array([0, 2], pa.int64()), "id": pa.array([1, None], pa.int64()), "name": ["a", "b"]}
    )
    upserts, bad = from_upserts(values, ["id"])
    assert bad == {1: "key column 'id' is null"}
    assert upserts.select(["id", OP]).to_pylist() == [{"id": 1, OP: UPSERT}]

    others = pa.table({ROWS.offset: pa.array([1, 3, 4, 5], pa.int64())})
    deletes, bad = from_tombstones(others, pa.array(["1", None, "x", "9"]), ["id"], row)
    assert bad == {1: "a tombstone whose key gives no 'id'", 2: "the key 'x' is no value of key column 'id' (int64)"}
    assert deletes.select([ROWS.offset, "id", "name", OP]).to_pylist() == [
        {ROWS.offset: 1, "id": 1, "name": None, OP: DELETE},
        {ROWS.offset: 5, "id": 9, "name": None, OP: DELETE},
    ]
    folded = fold(
        pa.concat_tables([upserts.select(deletes.column_names).cast(deletes.schema), deletes]).append_column(
            ROWS.partition, pa.array([0] * 3, pa.int32())
        ),
        ["id"],
    )
    assert folded.rows.to_pylist() == [] and sorted(folded.keys["id"].to_pylist()) == [1, 9]


def test_a_structured_key_names_the_key_columns_by_field() -> None:
    row = pa.schema([("region", pa.string()), ("id", pa.int64()), ("name", pa.string())])
    keys = pa.array(
        [{"region": "eu", "id": 7}, {"region": "us", "id": None}],
        pa.struct([("region", pa.string()), ("id", pa.int64())]),
    )
    deletes, bad = from_tombstones(pa.table({ROWS.offset: [0, 1]}), keys, ["region", "id"], row)
    assert bad == {1: "a tombstone whose key gives no 'id'"}
    assert deletes.select(["region", "id", OP]).to_pylist() == [{"region": "eu", "id": 7, OP: DELETE}]

    _, bad = from_tombstones(pa.table({ROWS.offset: [0]}), pa.array(["eu"]), ["region", "id"], row)
    assert bad == {0: "a string key cannot name the 2 key columns ['region', 'id']: use a structured key"}
