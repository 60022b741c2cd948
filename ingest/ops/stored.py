"""What the tables store, read back to rebuild a lost ledger (``ingest reset --from-table``): the
newest Kafka coordinates per partition, and the dead letters a crash left in files that neither
table holds."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from ingest import records
from ingest.committer import observe
from ingest.core.ledger import BatchCounts, DeadLetterSync, TopicPartition, remembering
from ingest.core.ledger_codec import decode_sync, encode, owed_property
from ingest.errors import CommitGaveUp, WrittenFilesGone
from ingest.iceberg.reading import read_written
from ingest.iceberg.table import IcebergTable
from ingest.intents import Append
from ingest.records import DEAD_LETTER_SCHEMA, DEAD_LETTERS, ROWS
from ingest.retry import with_retries

log = logging.getLogger(__name__)


def newest_coordinates(
    table: IcebergTable, columns: records.Coordinates, topics: Sequence[str]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Per partition of ``topics``: the newest offset ``table`` holds on its branch head, and the
    newest record timestamp (ms). Only the four coordinate columns are read, aggregated in Arrow."""
    topic, partition, offset, timestamp, _ = columns.names
    data = table.scan_columns([topic, partition, offset, timestamp])
    data = data.filter(pc.is_in(data[topic], pa.array(list(topics), pa.string())))
    if data.num_rows == 0:
        return {}, {}
    grouped = data.group_by([topic, partition]).aggregate([(offset, "max"), (timestamp, "max")])
    offsets: dict[TopicPartition, int] = {}
    times: dict[TopicPartition, int] = {}
    for row in grouped.to_pylist():  # one row per partition
        tp = TopicPartition(row[topic], row[partition])
        offsets[tp] = int(row[f"{offset}_max"])
        if row[f"{timestamp}_max"] is not None:
            times[tp] = int(row[f"{timestamp}_max"].timestamp() * 1000)
    return offsets, times


def unadded(
    rows: IcebergTable, dead: IcebergTable, pipeline: str, below: Mapping[TopicPartition, int]
) -> tuple[DeadLetterSync, pa.Table] | None:
    """The dead letters of ``pipeline``'s newest batch with dead letters (its marker, which the rows
    table's properties repeat) that neither table holds, below ``below`` (a ledger being rebuilt):
    what a crash between the batch's two commits left in files, once another tool expired the
    marker's snapshot. None if there are none, or the files are gone (said in the log)."""
    sync = decode_sync(rows.head().properties.get(owed_property(pipeline)))
    if sync is None or sync.files is None:
        return None
    d, r = DEAD_LETTERS, ROWS
    try:
        written = read_written(dead, sync.files, DEAD_LETTER_SCHEMA.names)
    except WrittenFilesGone:
        log.warning(
            "the files of the newest dead letters of %r (%s) are gone: if they were not added to %s before its "
            "ledger was lost, those records are in neither table (ingest verify names them)",
            pipeline,
            sync.sync_id,
            dead.identifier,
        )
        return None
    inside = pa.array([False] * written.num_rows, pa.bool_())
    for tp, end in below.items():
        mine = pc.and_(pc.equal(written[d.topic], tp.topic), pc.equal(written[d.partition], tp.partition))
        inside = pc.or_(inside, pc.and_(mine, pc.less(written[d.offset], end)))
    written = written.filter(inside)
    if written.num_rows == 0:
        return None
    stored = pa.concat_tables(
        [
            dead.scan_columns([d.topic, d.partition, d.offset]),
            rows.scan_columns([r.topic, r.partition, r.offset]).rename_columns([d.topic, d.partition, d.offset]),
        ],
        promote_options="permissive",
    )
    key = _coordinate_key
    missing = written.filter(pc.invert(pc.is_in(key(written), key(stored))))
    return (sync, missing) if missing.num_rows else None


def _coordinate_key(table: pa.Table) -> pa.Array:
    d = DEAD_LETTERS
    parts = [table[c].cast(pa.string()) for c in (d.topic, d.partition, d.offset)]
    return pc.binary_join_element_wise(*parts, ":")


def add_unadded(dead: IcebergTable, name: str, sync: DeadLetterSync, dead_letters: pa.Table, attempts: int) -> None:
    """Add ``dead_letters`` (a batch's, left in files by a crash; see :func:`unadded`) to pipeline
    ``name``'s intact dead-letter table ``dead``, once: its ledger then remembers the batch's marker."""
    files = dead.write(dead_letters)

    def attempt(number: int) -> None:
        found = observe(dead, name)
        if found is None or found.ledger.remembers(sync.sync_id):
            return
        ledger = replace(found.ledger, batch=found.ledger.batch + 1, resets=remembering(found.ledger, sync.sync_id))
        summary = encode(name, ledger, BatchCounts(dead_letters=dead_letters.num_rows), {"synced-by": sync.sync_id})
        dead.commit(Append(files, summary))

    with_retries(
        attempt,
        attempts,
        lambda: CommitGaveUp(
            f"adding the dead letters a crash left in files to {dead.identifier} did not settle after "
            f"{attempts} attempts; run the same reset again"
        ),
        f"dead letters {sync.sync_id} to {dead.identifier}",
    )
