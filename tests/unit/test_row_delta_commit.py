"""A changelog batch through the commit loop (:func:`ingest.committer.commit_rows` with
:class:`~ingest.committer.KeyDeletes`): its deletes and rows land in one snapshot with its ledger,
exactly once, whatever befalls the commit."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pytest

from ingest.changes import KeyDeletes
from ingest.committer import RowsCommit, commit_rows
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, TopicPartition
from ingest.core.plan import Batch
from ingest.retry import without_backoff
from ingest.testing.memory_state import Crashed, Fault
from ingest.testing.memory_table import MemoryCatalog

TP = TopicPartition("orders", 0)


def orders(ids: list[int], version: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([version] * len(ids))})


def _batch(number: int, end: int, base: Batch | None = None) -> Batch:
    return Batch(number, base.ledger() if base else None, base.end if base else {TP: 0}, {TP: end}, "c")


def contents(catalog: MemoryCatalog) -> Counter[tuple[int, str]]:
    data = catalog.scan()
    return Counter(zip(data["id"].to_pylist(), data["v"].to_pylist(), strict=True)) if data is not None else Counter()


@pytest.mark.parametrize("fault", ["ack-lost", "unknown", "crash-after"])
def test_a_changelog_batch_lands_once_whatever_befalls_its_commit(fault: Fault) -> None:
    catalog = MemoryCatalog("lake.customers")
    table = catalog.table()
    table.refresh()
    first = _batch(1, 5)
    commit_rows(
        table, RowsCommit("customers", first, first.ledger(), table.write(orders([1, 2, 3], "1")), BatchCounts(), 4)
    )
    second = _batch(2, 9, first)
    # key 2 updated, key 3 deleted, key 4 created
    deletes = KeyDeletes(("id",), pa.table({"id": pa.array([2, 3, 4], pa.int64())}))
    faults: list[Fault] = [fault]
    catalog.on_commit = lambda t: faults.pop() if faults else "ok"
    request = RowsCommit(
        "customers", second, second.ledger(), table.write(orders([2, 4], "2")), BatchCounts(), 4, deletes=deletes
    )

    with without_backoff():
        try:
            outcome = commit_rows(table, request)
        except Crashed:  # the process died after the commit applied: the same batch, run again
            again = catalog.table()
            again.refresh()
            outcome = commit_rows(again, replace(request, files=again.write(orders([2, 4], "2"))))

    assert outcome.decision in (Decision.COMMIT, Decision.LANDED)
    assert contents(catalog) == Counter({(1, "1"): 1, (2, "2"): 1, (4, "2"): 1})
    assert len(catalog.snapshots()) == 2
