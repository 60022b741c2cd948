"""The dead-letter steps a pair of memory tables shows as owed: what the rows head's marker asks of
the dead-letter table that it has not done yet (a crash between a commit's two steps leaves it for
the next run). What a reader of both tables must count as done already."""

from __future__ import annotations

import pyarrow as pa

from ingest.core.ledger import DeadLetterSync, TopicPartition
from ingest.core.ledger_codec import find_ledger
from ingest.intents import Spans
from ingest.testing.memory_table import MemoryCatalog


def _owed(rows: MemoryCatalog, dead: MemoryCatalog, pipeline: str) -> DeadLetterSync | None:
    head = find_ledger(pipeline, rows.table().ancestry())
    sync = head.ledger.sync if head is not None else None
    if sync is None:
        return None
    floor = find_ledger(pipeline, dead.table().ancestry())
    if floor is not None and floor.ledger.remembers(sync.sync_id):
        return None
    return sync


def owed_dead_letters(rows: MemoryCatalog, dead: MemoryCatalog, pipeline: str) -> pa.Table | None:
    """The dead letters the rows head's marker names that the dead-letter table has not added yet
    (a crash between a batch's two commits leaves them in files, for the next run to add); None if
    nothing is owed. What a reader of both tables sees as "in neither table, yet"."""
    sync = _owed(rows, dead, pipeline)
    if sync is None or sync.files is None:
        return None
    return pa.concat_tables([dead.stored[path].data for path in sync.files])


def owed_rewind(
    rows: MemoryCatalog, dead: MemoryCatalog, pipeline: str
) -> tuple[dict[TopicPartition, int], Spans] | None:
    """Where a rollback's marker on the rows head has the dead letters rewound to, and the gaps
    below it, while the dead-letter table has not done it yet (a crash between the rollback's two
    commits); None if no rewind is owed."""
    sync = _owed(rows, dead, pipeline)
    if sync is None or sync.rewind_to is None:
        return None
    return dict(sync.rewind_to), dict(sync.rewind_gaps or {})


def owed_publish(rows: MemoryCatalog, dead: MemoryCatalog, pipeline: str) -> str | None:
    """The dead-letter table's branch a replay's publish on the rows head makes main, while the
    dead-letter table has not done it yet (a crash between the publish's two commits); None if no
    publish is owed."""
    sync = _owed(rows, dead, pipeline)
    return sync.branch if sync is not None else None
