"""The changelog fold (:mod:`ingest.changes`) against a model: a dict from key to row, applied
change by change in offset order of each partition."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from ingest.changes import DELETE, OP, UPSERT, fold
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
