"""A changelog table judged against the fold of its changes (``ingest verify`` with ``changes:``).

The changes Kafka still holds of the committed ranges, decoded as the pipeline decodes them, say
what the table must hold for every key they change: the row of the key's last change among them
(by partition, then offset) if that upserts, with that change's Kafka coordinates, and no row if it
deletes. A key they do not change keeps whatever row it has, but no row may carry coordinates in
the checked ranges that are not its key's last change there, and no key may have two rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.changes import OP, UPSERT
from ingest.records import ROWS

_COORDINATES = (ROWS.topic, ROWS.partition, ROWS.offset)
_ORDER, _ROWS = "__ingest_order", "__ingest_rows"


@dataclass(frozen=True)
class FoldCheck:
    """What is wrong with a changelog table, each a table of the key columns and coordinates."""

    #: keys whose last change upserts and that have no row (the change's coordinates)
    missing: pa.Table
    #: keys whose row is not their last change's (the row's coordinates)
    stale: pa.Table
    #: keys whose last change deletes them and that have a row (the row's coordinates)
    undeleted: pa.Table
    #: keys with more than one row (each row's coordinates)
    duplicated: pa.Table
    #: rows with coordinates in the checked ranges that no change there left (the row's coordinates)
    unexpected: pa.Table

    @property
    def ok(self) -> bool:
        return not any(t.num_rows for t in (self.missing, self.stale, self.undeleted, self.duplicated, self.unexpected))


def judge(changes: pa.Table, rows: pa.Table, in_range: pa.Array, key: Sequence[str]) -> FoldCheck:
    """The table's ``rows`` (key columns and coordinates) against ``changes`` (the decoded changes of
    the checked ranges: key columns, coordinates, :data:`ingest.changes.OP`); ``in_range`` marks the
    rows whose coordinates lie in the checked ranges."""
    names = list(key)
    columns = [*names, *_COORDINATES]
    ordered = changes.select([*columns, OP]).sort_by([(ROWS.partition, "ascending"), (ROWS.offset, "ascending")])
    ordered = ordered.append_column(_ORDER, pa.array(range(ordered.num_rows), pa.int64()))
    newest = ordered.take(ordered.group_by(names, use_threads=False).aggregate([(_ORDER, "max")])[f"{_ORDER}_max"])
    upserts = newest.filter(pc.equal(newest[OP], UPSERT)).select(columns)
    deletes = newest.filter(pc.not_equal(newest[OP], UPSERT)).select(names)
    stored = rows.select(columns)

    counted = stored.group_by(names, use_threads=False).aggregate([([], "count_all")])
    twice = counted.filter(pc.greater(counted["count_all"], 1)).select(names)
    duplicated = stored.join(twice, names, join_type="left semi")
    missing = upserts.join(stored.select(names), names, join_type="left anti")
    keys_upserted = stored.join(upserts.select(names), names, join_type="left semi")
    stale = keys_upserted.join(upserts, columns, join_type="left anti")
    undeleted = stored.join(deletes, names, join_type="left semi")
    # (a changed key's rows are judged above: stale or undeleted)
    unexpected = stored.filter(in_range).join(newest.select(names), names, join_type="left anti")
    return FoldCheck(*(_sorted(t.select(columns)) for t in (missing, stale, undeleted, duplicated, unexpected)))


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in _COORDINATES])
