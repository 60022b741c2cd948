"""``ingest redrive``: dead letters that decode now, after a fix, moved to the rows exactly once.

A fix to ``schema:`` (a field made optional, a column added, a rename), to ``dead_letters`` or
``on_schema_change``, or to the registry subject can make dead letters decodable. ``redrive``
decodes this pipeline's dead letters again with the decoding in force (the same decoder a batch
uses, the table's schema evolved in the same commit as a batch's would be), and for those that now
decode:

1. commits their rows to the rows table in one snapshot whose ledger is the head's, unchanged but
   for a batch number one higher and a :class:`~ingest.core.ledger.DeadLetterSync` marker naming
   the redriven offset ranges (``redriven``) under a fresh id, recorded as ``redrive-id`` too. The
   higher batch number fences a batch planned before it: that batch plans again on top of the
   marker, and settles it first;
2. then removes exactly those dead letters from the dead-letter table, in one commit that records
   the id (``synced-by``) and how many it removed (``redriven``), and remembers the id.

A crash between the two is finished by whichever comes next (``redrive`` again, or the next batch,
which settles the marker before it commits). Each rows commit is a compare-and-swap: it first
settles any marker the head carries, then keeps only the dead letters still in the dead-letter
table (a racing ``redrive`` may have taken some), so no record is ever in both tables once settled,
nor in neither. A commit names at most :data:`MAX_SPANS` offset ranges (the marker is in the
snapshot summary, which every plan reads): more make several commits.

Only dead letters below the rows ledger are redriven: one at or past it belongs to a batch whose
rows are not committed yet, which will commit it (or re-read it) itself. Records that still do not
decode stay where they are; the result lists their commonest reasons. ``--dry-run`` decodes and
reports, changing nothing. The dead letters examined are held in memory together.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest import failpoints
from ingest.assembly import Opened
from ingest.committer import observe
from ingest.core.ledger import BatchCounts, DeadLetterSync, TopicPartition
from ingest.core.ledger_codec import encode, read_extra, register
from ingest.dead_letters import settle
from ingest.engines.task_spec import TaskSpec
from ingest.errors import CommitGaveUp, ConfigError, SchemaAhead
from ingest.iceberg.reading import dead_letters_of
from ingest.iceberg.table import MAIN
from ingest.intents import Append
from ingest.pipeline import MAX_SCHEMA_CATCH_UPS
from ingest.records import DEAD_LETTERS, ROWS, Coordinates, Decoded, RawChunk
from ingest.retry import with_retries

log = logging.getLogger(__name__)

#: offset ranges one redrive commit may name in its marker
MAX_SPANS = 1_000
#: dead letters decoded at a time
CHUNK = 25_000

Spans = dict[TopicPartition, tuple[tuple[int, int], ...]]


@dataclass
class Redrive:
    """What ``ingest redrive`` did (or, with ``dry_run``, would do)."""

    pipeline: str
    dry_run: bool = False
    #: the pipeline's dead letters below the rows ledger, decoded again
    examined: int = 0
    #: those that decode now: committed to the rows (dry run: would be)
    redriven: int = 0
    #: those that still do not decode, left in the dead letters
    still_dead: int = 0
    #: the rows snapshots the redriven records were committed in
    snapshots: list[int] = field(default_factory=list)
    #: the commonest reasons of those still dead, with their counts
    reasons: list[tuple[str, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def redrive(pipeline: Opened, *, dry_run: bool = False) -> Redrive:
    config = pipeline.config
    if pipeline.rows.branch != MAIN:
        raise ValueError("redrive commits to main")
    if config.changes is not None:
        raise ConfigError(
            f"redrive of {config.pipeline!r} refused: it is a changelog (changes:), and a dead letter's change may be "
            "older than its key's row, which redriving it would replace. Nothing was changed. Fix the decoding, then "
            "replay from a snapshot before the dead letters (ingest replay --from-snapshot S --publish)."
        )
    result = Redrive(config.pipeline, dry_run=dry_run)
    found = pipeline.ledger()
    if found is None:
        return result  # no batch committed: no dead letters it could have set aside
    if not dry_run:  # a step the dead-letter table owes (an interrupted redrive's removal, say) first
        settle(pipeline.dead, pipeline.rows, config, found.ledger, config.commit.max_attempts)
    pipeline.dead.refresh()
    dead = _below(dead_letters_of(pipeline.dead, config.topics_in(found.ledger.topics)), found.ledger.offsets)
    pending = found.ledger.sync.redriven if found.ledger.sync is not None else None
    if dry_run and pending:  # an interrupted redrive's, not removed yet: in the rows already
        dead = dead.filter(pc.invert(_within(dead, DEAD_LETTERS.offset, pending)))
    result.examined = dead.num_rows
    rows: list[pa.Table] = []
    reasons: Counter[str] = Counter()
    for lo in range(0, dead.num_rows, CHUNK):
        decoded = _decode(pipeline, dead.slice(lo, CHUNK))
        rows.append(decoded.rows)
        reasons.update(decoded.dead_letters.column("error").to_pylist())
    result.still_dead = reasons.total()
    result.reasons = reasons.most_common(5)
    good = pa.concat_tables(rows).combine_chunks() if rows else None
    result.redriven = good.num_rows if good is not None else 0
    if dry_run or good is None or good.num_rows == 0:
        return result
    for group in _groups(good, config.batch.max_records):
        snapshot = _commit(pipeline, group)
        if snapshot is not None:
            result.snapshots.append(snapshot)
    return result


def _below(dead: pa.Table, offsets: Mapping[TopicPartition, int]) -> pa.Table:
    """The dead letters below ``offsets`` (of partitions it has), by partition and offset."""
    c = DEAD_LETTERS
    below = dead.filter(_below_mask(dead, c, offsets))
    return below.sort_by([(c.topic, "ascending"), (c.partition, "ascending"), (c.offset, "ascending")])


def _below_mask(table: pa.Table, c: Coordinates, offsets: Mapping[TopicPartition, int]) -> pa.Array:
    """Whether each record of ``table`` (coordinates ``c``) is below ``offsets`` (of a partition it has)."""
    keep = pa.array(np.zeros(table.num_rows, bool))
    for tp, end in offsets.items():
        mine = pc.and_(pc.equal(table[c.topic], tp.topic), pc.equal(table[c.partition], tp.partition))
        keep = pc.or_(keep, pc.and_(mine, pc.less(table[c.offset], end)))
    return keep


def _within(table: pa.Table, offset_column: str, spans: Mapping[TopicPartition, Sequence[tuple[int, int]]]) -> pa.Array:
    """Whether each row of ``table`` (dead-letter coordinates) is in ``spans``."""
    c = DEAD_LETTERS
    hit = pa.array(np.zeros(table.num_rows, bool))
    for tp, ranges in spans.items():
        mine = pc.and_(pc.equal(table[c.topic], tp.topic), pc.equal(table[c.partition], tp.partition))
        for lo, hi in ranges:
            inside = pc.and_(pc.greater_equal(table[offset_column], lo), pc.less(table[offset_column], hi))
            hit = pc.or_(hit, pc.and_(mine, inside))
    return hit


def _decode(pipeline: Opened, dead: pa.Table) -> Decoded:
    """``dead`` decoded as a batch decodes records now, the table's fields evolved as a batch's
    would be for the writer schemas they turn out to need."""
    chunk = _raw(dead)
    for _ in range(MAX_SCHEMA_CATCH_UPS):
        try:
            return TaskSpec.of(pipeline.config, pipeline.fields).decoder().decode(chunk)
        except SchemaAhead as ahead:
            pipeline.catch_up(ahead)
    return TaskSpec.of(pipeline.config, pipeline.fields).decoder().decode(chunk)


def _raw(dead: pa.Table) -> RawChunk:
    """Dead letters as the chunk of Kafka records they were read as."""
    c = DEAD_LETTERS
    headers = dead.column("headers").to_pylist()
    values = dead.column("value").to_pylist()
    return RawChunk(
        topic=dead.column(c.topic).combine_chunks(),
        partition=dead.column(c.partition).combine_chunks(),
        offset=dead.column(c.offset).combine_chunks(),
        timestamp=dead.column(c.timestamp).combine_chunks(),
        key=dead.column(c.key).combine_chunks(),
        values=values,
        headers=lambda i: [(h["key"], h["value"]) for h in headers[i]] if headers[i] else None,
        nbytes=sum(len(v or b"") for v in values),
    )


def _spans(rows: pa.Table) -> Spans:
    """The offsets of ``rows`` (sorted by partition and offset) as ``[start, end)`` runs per partition."""
    spans: dict[TopicPartition, list[tuple[int, int]]] = {}
    coordinates = zip(
        rows.column(ROWS.topic).to_pylist(),
        rows.column(ROWS.partition).to_pylist(),
        rows.column(ROWS.offset).to_pylist(),
        strict=True,
    )
    for (topic, partition), run in itertools.groupby(coordinates, key=lambda c: (c[0], c[1])):
        runs = spans.setdefault(TopicPartition(topic, partition), [])
        for offset in (o for _, _, o in run):
            if runs and runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], offset + 1)
            else:
                runs.append((offset, offset + 1))
    return {tp: tuple(runs) for tp, runs in spans.items()}


def _groups(rows: pa.Table, max_records: int) -> Iterator[pa.Table]:
    """``rows`` in commits of at most ``max_records`` and :data:`MAX_SPANS` offset ranges."""
    offsets = rows.column(ROWS.offset).to_numpy()
    partitions = rows.column(ROWS.partition).to_numpy()
    topics = rows.column(ROWS.topic).combine_chunks()
    same_topic = np.ones(len(offsets), bool)
    same_topic[1:] = pc.equal(topics.slice(1), topics.slice(0, len(offsets) - 1)).to_numpy(zero_copy_only=False)
    starts_run = np.ones(len(offsets), bool)  # a row that does not continue the previous row's range
    starts_run[1:] = ~((offsets[1:] == offsets[:-1] + 1) & (partitions[1:] == partitions[:-1]) & same_topic[1:])
    runs = np.cumsum(starts_run)  # the range each row is in, counted from 1
    lo = 0
    while lo < len(offsets):
        hi = min(len(offsets), lo + max_records)
        over = np.flatnonzero(runs[lo:hi] > runs[lo] + MAX_SPANS - 1)
        if len(over):
            hi = lo + int(over[0])
        yield rows.slice(lo, hi - lo)
        lo = hi


def _key(table: pa.Table, c: Coordinates) -> pa.Array:
    """One string per row naming its record (``topic:partition:offset``), to match rows with dead letters."""
    parts = [table.column(name).cast(pa.string()) for name in (c.topic, c.partition, c.offset)]
    return pc.binary_join_element_wise(*parts, ":")


def _commit(pipeline: Opened, group: pa.Table) -> int | None:
    """Commit ``group`` (rows decoded from dead letters) to the rows table with the marker that
    removes those dead letters, then remove them; returns the rows snapshot (None if a racing
    redrive had committed them all already)."""
    config, rows, dead = pipeline.config, pipeline.rows, pipeline.dead
    name, attempts = config.pipeline, config.commit.max_attempts
    sync_id = f"redrive-{uuid.uuid4().hex[:16]}"
    written: tuple[tuple[str, ...], list[Any]] | None = None  # the records files were written for, and the files
    since: list[int | None] = []  # the rows head the first attempt saw: a landed attempt is above it

    def attempt(number: int) -> int | None:
        nonlocal written
        found = observe(rows, name)
        assert found is not None  # the redrive read a ledger, and ledgers are never removed
        if not since:
            since.append(rows.branch_head(MAIN))
        for snap in rows.ancestry():  # an earlier attempt landed (its acknowledgement lost), maybe under others
            if snap.snapshot_id == since[0]:
                break
            if read_extra(name, snap.summary, "redrive-id") == sync_id:
                return snap.snapshot_id
        settle(dead, rows, config, found.ledger, attempts)  # the head's marker, if it owes a step
        dead.refresh()  # what is still a dead letter now, not when this handle last looked
        still = dead.dead_letter_coordinates(_spans(group))
        mine = group.filter(pc.is_in(_key(group, ROWS), _key(still, DEAD_LETTERS)))
        # only records the rows ledger has passed: past it, a batch (after a rollback, say) stores them itself
        mine = mine.filter(_below_mask(mine, ROWS, found.ledger.offsets))
        if mine.num_rows == 0:
            return None  # a racing redrive committed them, and its marker was settled above
        records = tuple(_key(mine, ROWS).to_pylist())
        if written is None or written[0] != records:
            written = (records, rows.write(mine))
        failpoints.reach("files-written")
        ledger = replace(
            found.ledger,
            batch=found.ledger.batch + 1,
            start_offsets=dict(found.ledger.offsets),
            lost=(),
            reset_id=None,
            sync=DeadLetterSync(sync_id, redriven=_spans(mine)),
        )
        summary = encode(name, ledger, BatchCounts(records=mine.num_rows), extra={"redrive-id": sync_id})
        return rows.commit(Append(written[1], summary, register(rows.head().properties, name)))

    snapshot = with_retries(
        attempt,
        attempts,
        lambda: CommitGaveUp(
            f"the redrive commit {sync_id} to {rows.identifier} did not settle after {attempts} attempts (other "
            "writers kept committing). Nothing was duplicated; run `ingest redrive` again."
        ),
        f"the redrive commit {sync_id} to {rows.identifier}",
    )
    if snapshot is not None:
        failpoints.reach("between-tables")
        found = observe(rows, name)
        if found is not None:
            settle(dead, rows, config, found.ledger, attempts)
    return snapshot
