"""How a changelog batch's commit should delete: position deletes against copy-on-write (#38).

A table of ``--rows`` orders keyed by ``id`` (written as a run of appends, as batches would), and
a batch of ``--changes`` changes over it: 60 % updates and 10 % deletes of existing keys, 30 % new
keys. The batch is committed twice, each on its own copy of the table:

* **position deletes** (:class:`ingest.intents.RowDelta`): the live rows of the batch's keys are
  found by reading the key column of the data files that may hold them, and deleted by position
  delete files; the new rows are added;
* **copy-on-write**: the same rows found the same way, then every data file holding one is read
  whole, rewritten without them, and replaced (:class:`ingest.intents.Rewrite`), the new rows added.

Each is timed (the commit, and a full read of the table after it through pyiceberg), for the
table as given and four times larger, so the cost's growth with the table shows. The report is
appended to ``results.jsonl`` (``"suite": "row-delta"``).

    python -m tests.benchmarks.row_delta [--rows 500000] [--changes 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.changes import DELETE, OP, UPSERT, fold
from ingest.iceberg.catalog import connect
from ingest.iceberg.layout import open_table
from ingest.iceberg.row_delta import rows_to_delete
from ingest.iceberg.schema import rows_schema as iceberg_rows_schema
from ingest.iceberg.table import IcebergTable
from ingest.intents import Append, Rewrite, RowDelta
from ingest.records import ROWS, Field, rows_schema

RESULTS = Path(__file__).with_name("results.jsonl")
KEY = ("id",)
FIELDS = [("customer", "string"), ("status", "string"), ("amount", "double"), ("quantity", "long"),
          ("note", "string"), ("city", "string"), ("sku", "string"), ("discount", "double")]  # fmt: skip


DECLARED = [Field("id", "long", required=True), *(Field(n, k) for n, k in FIELDS)]
SCHEMA = rows_schema(DECLARED)


def orders(ids: np.ndarray, offset: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    words = np.array([f"w{i:05d}" for i in range(5000)])
    columns: dict[str, Any] = {
        ROWS.topic: pa.array(["orders"] * n),
        ROWS.partition: pa.array(np.zeros(n, np.int32)),
        ROWS.offset: pa.array(np.arange(offset, offset + n, dtype=np.int64)),
        ROWS.timestamp: pa.nulls(n, pa.timestamp("us", tz="UTC")),
        ROWS.key: pa.nulls(n, pa.binary()),
        "id": pa.array(ids, pa.int64()),
    }
    for name, kind in FIELDS:
        if kind == "double":
            columns[name] = pa.array(rng.random(n) * 100)
        elif kind == "long":
            columns[name] = pa.array(rng.integers(0, 100, n))
        else:
            columns[name] = pa.array(np.char.add(words[rng.integers(0, 5000, n)], "-customer-order-text"))
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def build(directory: Path, rows: int, appends: int) -> IcebergTable:
    catalog = connect({"name": "bench", "type": "sql", "uri": f"sqlite:///{directory}/c.db",
                       "warehouse": directory.as_uri()})  # fmt: skip
    table = open_table(catalog, "bench.orders", iceberg_rows_schema(DECLARED))
    table.refresh()
    per = rows // appends
    for i in range(appends):
        table.commit(Append(table.write(orders(np.arange(i * per, (i + 1) * per), i * per, i)), {}))
    return table


def changes(rows: int, n: int, seed: int = 7) -> pa.Table:
    """``n`` changes: 60 % updates and 10 % deletes of random existing keys, 30 % new keys."""
    rng = np.random.default_rng(seed)
    updates, deletes = int(n * 0.6), int(n * 0.1)
    inserts = n - updates - deletes
    ids = np.concatenate([rng.integers(0, rows, updates + deletes), np.arange(rows, rows + inserts)])
    ops = np.array([UPSERT] * updates + [DELETE] * deletes + [UPSERT] * inserts)
    order = rng.permutation(n)
    batch = orders(ids[order], 10**9, seed)
    return batch.append_column(OP, pa.array(ops[order]))


def position_deletes(table: IcebergTable, batch: pa.Table) -> float:
    started = time.perf_counter()
    folded = fold(batch, KEY)
    landing = batch.take(folded.rows).drop_columns([OP])
    table.commit(RowDelta(table.write(landing), KEY, folded.keys, {}))
    return time.perf_counter() - started


def copy_on_write(table: IcebergTable, batch: pa.Table) -> float:
    started = time.perf_counter()
    folded = fold(batch, KEY)
    landing = batch.take(folded.rows).drop_columns([OP])
    pi = table.table
    head = table.branch_head("main")
    assert head is not None
    removed, rewritten = [], []
    for data_file, positions in rows_to_delete(pi, head, KEY, folded.keys):
        with pi.io.new_input(data_file.file_path).open() as stream:
            whole = pq.read_table(stream)
        keep = pc.invert(pc.is_in(pa.array(range(whole.num_rows), pa.int64()), positions))
        removed.append(data_file)
        rewritten.extend(table.write(whole.filter(keep)))
    table.commit(Rewrite(removed, [*rewritten, *table.write(landing)], {}))
    return time.perf_counter() - started


def read_all(table: IcebergTable) -> tuple[float, int]:
    started = time.perf_counter()
    n = table.table.catalog.load_table("bench.orders").scan().to_arrow().num_rows
    return time.perf_counter() - started, n


def measure(rows: int, n: int, appends: int) -> dict[str, Any]:
    batch = changes(rows, n)
    out: dict[str, Any] = {"rows": rows, "changes": n, "appends": appends}
    for name, how in (("position_deletes", position_deletes), ("copy_on_write", copy_on_write)):
        directory = Path(tempfile.mkdtemp(prefix=f"row-delta-{name}-"))
        try:
            table = build(directory, rows, appends)
            seconds = how(table, batch)
            read_s, count = read_all(table)
            out[name] = {"commit_s": round(seconds, 3), "read_s": round(read_s, 3), "rows_after": count}
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    assert out["position_deletes"]["rows_after"] == out["copy_on_write"]["rows_after"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--appends", type=int, default=10, help="appends the table is built of (its data files)")
    args = parser.parse_args()
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "suite": "row-delta",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "sizes": [
            measure(args.rows, args.changes, args.appends),
            measure(4 * args.rows, args.changes, 4 * args.appends),
        ],
    }
    print(json.dumps(report, indent=2))
    with RESULTS.open("a") as out:
        out.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
