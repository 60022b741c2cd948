"""A changelog batch folded into what its commit does (``changes:`` in a pipeline's config).

A changelog topic's records are changes to rows, each naming its row by a key (one or more
columns, the table's identifier fields): an upsert carries the row's new image, a delete only its
key. A batch's changes, decoded, are one Arrow table: the key columns, the row's other columns (null
for a delete), the record's Kafka coordinates and :data:`OP`. Folding them gives the commit's row
delta: every key the batch touches has its live row deleted, and each key whose last change (in
offset order of its partition) is an upsert gets that change's row. So a table committed batch by
batch holds, for every key, the image of its newest committed change, or no row if that deleted it.

A key is expected to stay in one partition (Debezium and keyed producers put a key's changes in
one); if a batch meets a key in several, the change of the highest partition, then offset, wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.records import ROWS

#: the column a decoded change carries its kind in (dropped before its row is written)
OP = "_ingest_change"
#: the values of :data:`OP`
UPSERT, DELETE = "upsert", "delete"

_INDEX, _ORDER = "__ingest_index", "__ingest_order"


@dataclass(frozen=True)
class Folded:
    """What a batch's changes commit."""

    #: the positions (in the changes) of the rows that land: per key, its last change if an upsert
    rows: pa.Array
    #: every key the changes touch, once: the live rows the commit deletes first
    keys: pa.Table


def fold(changes: pa.Table, key: Sequence[str]) -> Folded:
    """Fold ``changes`` (key columns ``key``, :data:`OP`, the Kafka partition and offset; no null
    key: such a record is a dead letter before it gets here) into what their commit does."""
    names = list(key)
    if not changes.num_rows:
        return Folded(pa.array([], pa.int64()), changes.select(names))
    index = pa.array(range(changes.num_rows), pa.int64())
    narrow = changes.select([*names, OP, ROWS.partition, ROWS.offset]).append_column(_INDEX, index)
    ordered = narrow.sort_by([(ROWS.partition, "ascending"), (ROWS.offset, "ascending"), (_INDEX, "ascending")])
    ordered = ordered.append_column(_ORDER, index)
    last = ordered.group_by(names, use_threads=False).aggregate([(_ORDER, "max")])
    newest = ordered.take(last[f"{_ORDER}_max"])
    landing = newest.filter(pc.equal(newest[OP], UPSERT))[_INDEX]
    return Folded(landing.take(pc.sort_indices(landing)).combine_chunks(), last.select(names))
