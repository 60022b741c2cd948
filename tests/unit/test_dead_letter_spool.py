"""A batch's dead letters held compressed: the same rows back, in order, a group at a time."""

from __future__ import annotations

import pickle

import pyarrow as pa

from ingest.dead_letter_spool import DeadLetterSpool
from ingest.records import DEAD_LETTER_SCHEMA


def letters(lo: int, hi: int, error: str = "bad") -> pa.Table:
    n = hi - lo
    return pa.table(
        {
            "topic": ["orders"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(lo, hi), pa.int64()),
            "timestamp": pa.nulls(n, pa.timestamp("us", tz="UTC")),
            "key": pa.nulls(n, pa.binary()),
            "value": [b"x" * 100] * n,
            "headers": pa.nulls(n, DEAD_LETTER_SCHEMA.field("headers").type),
            "error": [error] * n,
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def test_the_dead_letters_come_back_in_order_whole_or_a_group_at_a_time() -> None:
    spool = DeadLetterSpool.of(letters(0, 1000), letters(1000, 1000), letters(1000, 3000))
    other = DeadLetterSpool.of(letters(3000, 3500, "worse"))
    joined = pickle.loads(pickle.dumps(DeadLetterSpool.joined([spool, DeadLetterSpool(), other])))

    assert joined.num_rows == 3500
    whole = list(joined.groups(max_bytes=1 << 40))
    assert len(whole) == 1 and whole[0].equals(pa.concat_tables([letters(0, 3000), letters(3000, 3500, "worse")]))
    groups = list(joined.groups(max_bytes=letters(0, 1500).nbytes))
    assert [g.num_rows for g in groups] == [1000, 2000, 500]  # a part larger than the bound stays whole
    assert pa.concat_tables(groups).equals(whole[0])
    assert joined.commonest_reasons(1) == [("bad", 3000)]


def test_an_empty_spool() -> None:
    assert DeadLetterSpool().num_rows == 0
    assert list(DeadLetterSpool().groups()) == []
    assert DeadLetterSpool().commonest_reasons(3) == []
