"""``ingest reset``: move a pipeline's ledger without data, recorded and applied exactly once.

The reset is a snapshot with no data files whose summary carries the new ledger and who/why
(``reset-id``, ``reset-by``, ``reset-reason``). Its id defaults to a hash of the command (pipeline,
target, reason), so an orchestrator re-running the same command finds it already applied and does
not move the ledger twice; pass ``--reset-id`` to make a deliberate repeat distinct.

A reset also works when the ledger is **lost** (every snapshot carrying it was expired or rewritten
away by another tool): the reset is the operator's explicit statement of where to resume, so it
commits as if there were no ledger and records ``reset-recovered=true``. Target ``table``
(``--from-table``) states no offsets itself: it rebuilds the lost ledger from the Kafka coordinates
stored in the table and its dead letters (:mod:`ingest.core.rebuild`), which is exact, and restores
a lost dead-letter ledger (the floor) too.
"""

from __future__ import annotations

import getpass
import hashlib
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest import records
from ingest.committer import RowsCommit, commit_rows, ledger_lost, observe
from ingest.core.commit import Decision
from ingest.core.ledger import (
    RESET_MEMORY,
    AppliedReset,
    BatchCounts,
    DeadLetterSync,
    Found,
    Ledger,
    TopicPartition,
    carried,
    carried_origin,
    remembering,
)
from ingest.core.ledger_codec import encode, find_ledger, read_extra
from ingest.core.plan import Batch, KafkaView, changed_topics
from ingest.core.rebuild import check_coordinates, rebuild_floor, rebuild_offsets
from ingest.dead_letters import settle, unadded
from ingest.errors import CommitGaveUp, ConfigError, FatalError
from ingest.iceberg.table import IcebergTable
from ingest.pipeline import Pipeline
from ingest.ports import DataFile, LedgerTable
from ingest.retry import with_retries

ResetKind = Literal["offsets", "earliest", "latest", "timestamp", "table"]


@dataclass(frozen=True)
class ResetTarget:
    """Exactly one of: explicit offsets, earliest, latest, a timestamp (ms), or the table's data."""

    kind: ResetKind
    offsets: dict[TopicPartition, int] | None = None
    timestamp_ms: int | None = None

    def describe(self) -> str:
        if self.kind == "offsets" and self.offsets is not None:
            return "offsets:" + ",".join(f"{tp.topic}:{tp.partition}={o}" for tp, o in sorted(self.offsets.items()))
        if self.kind == "timestamp":
            return f"timestamp:{self.timestamp_ms}"
        return self.kind


def parse_offsets(text: str) -> dict[TopicPartition, int]:
    """``orders:0=120,orders:1=95`` as offsets."""
    result = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        try:
            where, offset = item.split("=")
            topic, partition = where.rsplit(":", 1)
            result[TopicPartition(topic, int(partition))] = int(offset)
        except ValueError:
            raise ConfigError(f"--to-offsets: {item!r} is not TOPIC:PARTITION=OFFSET") from None
    return result


def _spec(offsets: Mapping[TopicPartition, int]) -> str:
    return ",".join(f"{tp.topic}:{tp.partition}={o}" for tp, o in sorted(offsets.items()))


ResetStatus = Literal["applied", "already-applied", "not-needed"]


@dataclass(frozen=True)
class OffsetMove:
    """Where a reset moved one partition's ledger offset."""

    topic: str
    partition: int
    moved_from: int | None
    to: int
    #: ``--from-table`` only: what the offset was rebuilt from (``table``, ``ledger``, ``low-watermark``)
    basis: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.moved_from,
            "to": self.to,
        }
        return data | ({"basis": self.basis} if self.basis is not None else {})


@dataclass(frozen=True)
class FloorRebuilt:
    """``--from-table``: the dead-letter ledger rebuilt from the dead letters."""

    snapshot_id: int | None
    floor: Mapping[TopicPartition, int]

    def as_dict(self) -> dict[str, Any]:
        offsets = [{"topic": tp.topic, "partition": tp.partition, "floor": o} for tp, o in sorted(self.floor.items())]
        return {"snapshot_id": self.snapshot_id, "offsets": offsets}


@dataclass(frozen=True)
class ResetResult:
    """``ingest reset``: what was applied (once, whatever the number of runs)."""

    pipeline: str
    reset_id: str
    status: ResetStatus
    snapshot_id: int | None
    batch: int | None = None
    by: str | None = None
    reason: str | None = None
    #: the ledger was lost and this reset replaced it
    recovered: bool | None = None
    dead_letter_ledger_lost: bool | None = None
    dead_letter_floor: FloorRebuilt | None = None
    offsets: tuple[OffsetMove, ...] | None = None
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "pipeline": self.pipeline,
            "reset_id": self.reset_id,
            "status": self.status,
            "snapshot_id": self.snapshot_id,
        }
        for key in ("batch", "by", "reason", "recovered", "dead_letter_ledger_lost", "note"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        if self.dead_letter_floor is not None:
            data["dead_letter_floor"] = self.dead_letter_floor.as_dict()
        if self.offsets is not None:
            data["offsets"] = [move.as_dict() for move in self.offsets]
        return data


@dataclass(frozen=True)
class ResetCommand:
    """One reset command: which pipeline, where to, who, why, under which id."""

    pipeline: str
    target: ResetTarget
    reason: str
    reset_id: str
    by: str
    max_attempts: int

    def extra(self, recovered: bool) -> dict[str, str]:
        extra = {
            "reset-by": self.by,
            "reset-reason": self.reason,
            "reset-target": self.target.describe(),
        }
        return extra | ({"reset-recovered": "true"} if recovered else {})

    def report(self, status: ResetStatus, snapshot_id: int | None, **more: Any) -> ResetResult:
        return ResetResult(self.pipeline, self.reset_id, status, snapshot_id, **more)


def default_reset_id(pipeline: str, target: ResetTarget, reason: str) -> str:
    """The id of a reset command: the same command run again is the same reset."""
    return hashlib.sha256(f"{pipeline}|{target.describe()}|{reason}".encode()).hexdigest()[:16]


class OffsetsSource(Protocol):
    """What a reset asks of Kafka: the partitions and their watermarks, and offsets by time."""

    def describe(self) -> KafkaView: ...

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]: ...


def reset(pipeline: Pipeline, target: ResetTarget, reason: str, reset_id: str | None = None) -> ResetResult:
    name = pipeline.config.pipeline
    command = ResetCommand(
        name,
        target,
        reason,
        reset_id or default_reset_id(name, target, reason),
        f"{getpass.getuser()}@{socket.gethostname()}",
        pipeline.config.commit.max_attempts,
    )
    dead_lost = ledger_lost(pipeline.dead, name, observe(pipeline.dead, name, recovering=True))
    if target.kind == "table":
        found = observe(pipeline.rows, name, recovering=True)
        return _from_table(pipeline, command, found, ledger_lost(pipeline.rows, name, found), dead_lost)

    def settle_dead_letters(ledger: Ledger | None) -> None:
        # a rollback or publish may still owe its dead-letter step: a reset must not bury its marker
        settle(pipeline.dead, pipeline.rows, pipeline.config, ledger, command.max_attempts)

    result = move_ledger(pipeline.rows, pipeline.source, command, settle_dead_letters)
    return replace(result, dead_letter_ledger_lost=dead_lost) if result.status == "applied" else result


def move_ledger(
    rows: LedgerTable,
    source: OffsetsSource,
    command: ResetCommand,
    before_commit: Callable[[Ledger | None], None] = lambda _: None,
) -> ResetResult:
    """Move the ledger on ``rows`` to ``command``'s target (not ``table``), once: a command whose
    id the table's history (or its ledger's memory) holds is already applied. ``before_commit``
    gets the ledger the reset commits on top of."""
    name = command.pipeline
    found = observe(rows, name, recovering=True)
    lost = ledger_lost(rows, name, found)
    applied = applied_reset(rows, name, command.reset_id)
    if applied is not None:
        return command.report("already-applied", applied)
    before_commit(found.ledger if found else None)
    view = source.describe()
    current = dict(found.ledger.offsets) if found else {}
    recreated = {topic for topic, _, _ in changed_topics(found.ledger if found else None, view)}
    new = _target_offsets(command, source, view, current, lost, recreated)
    _check_retained(view, new)
    timestamps = found.ledger.timestamps if found else {}
    renewed = recreated & _sets(command.target, view)
    snapshot_id, number = _commit(command, rows, found, new, view, timestamps, lost, renewed=renewed)
    return command.report(
        "applied",
        snapshot_id,
        batch=number,
        by=command.by,
        reason=command.reason,
        recovered=lost,
        offsets=tuple(OffsetMove(tp.topic, tp.partition, current.get(tp), o) for tp, o in sorted(new.items())),
    )


def applied_reset(table: LedgerTable, pipeline: str, reset_id: str) -> int | None:
    """The snapshot of ``table``'s branch that applied reset ``reset_id`` (or, once that one was
    expired, the snapshot whose ledger remembers it), if any."""
    for snap in table.ancestry():
        if read_extra(pipeline, snap.summary, "reset-id") == reset_id:
            return snap.snapshot_id
    found = find_ledger(pipeline, table.ancestry())
    if found is not None and found.ledger.remembers(reset_id):
        return found.snapshot_id
    return None


def _target_offsets(
    command: ResetCommand,
    source: OffsetsSource,
    view: KafkaView,
    current: dict[TopicPartition, int],
    lost: bool,
    recreated: set[str],
) -> dict[TopicPartition, int]:
    """The offsets the reset moves the ledger to. ``recreated``: the topics whose Kafka id is not the
    ledger's (a reset that names one of them records its new id)."""
    target = command.target
    if target.kind == "offsets":
        assert target.offsets is not None
        unknown = sorted(set(target.offsets) - set(view.partitions))
        if unknown:
            raise ConfigError(f"--to-offsets names partitions Kafka does not have: {', '.join(map(str, unknown))}")
        unnamed = sorted(set(view.partitions) - set(target.offsets))
        if lost and unnamed:
            # with the ledger lost they have no offset to keep, and earliest would ingest them again
            raise ConfigError(
                f"the ledger of {command.pipeline!r} is lost, so --to-offsets must name every partition; "
                f"missing: {', '.join(map(str, unnamed))}. Or rebuild the ledger exactly with --from-table."
            )
        # a recreated topic the reset names is a new topic: none of the ledger's offsets of it applies
        renewed = recreated & _sets(target, view)
        partial = [tp for tp in unnamed if tp.topic in renewed]
        if partial:
            raise ConfigError(
                f"topic(s) {', '.join(sorted(renewed))} were deleted and created again (Kafka's topic ids are not "
                "the ledger's), so --to-offsets must name every partition of them; missing: "
                f"{', '.join(map(str, partial))}"
            )
        new = {tp: o for tp, o in current.items() if tp.topic not in renewed} | target.offsets
        for tp in view.partitions:
            new.setdefault(tp, view.partitions[tp].low)
        return new
    if target.kind == "earliest":
        return {tp: wm.low for tp, wm in view.partitions.items()}
    if target.kind == "latest":
        return {tp: wm.high for tp, wm in view.partitions.items()}
    assert target.kind == "timestamp" and target.timestamp_ms is not None
    found = source.offsets_for_time(sorted(view.partitions), target.timestamp_ms)
    return {tp: (o if o >= 0 else view.partitions[tp].high) for tp, o in found.items()}


def _check_retained(view: KafkaView, new: Mapping[TopicPartition, int], hint: str = "") -> None:
    outside = [
        f"{tp} offset {o} (retained [{view.partitions[tp].low}, {view.partitions[tp].high}])"
        for tp, o in sorted(new.items())
        if not view.partitions[tp].low <= o <= view.partitions[tp].high
    ]
    if outside:
        raise FatalError("reset refused, offsets outside what Kafka holds: " + "; ".join(outside) + hint)


def _commit(
    command: ResetCommand,
    table: LedgerTable,
    found: Found | None,
    new: Mapping[TopicPartition, int],
    view: KafkaView,
    timestamps: Mapping[TopicPartition, int],
    recovering: bool,
    files: Sequence[DataFile] = (),
    renewed: Collection[str] = (),
) -> tuple[int | None, int]:
    """Commit ledger ``new`` to ``table`` in a snapshot without data (but for ``files``, dead
    letters a rebuilt floor adds): (snapshot id, batch number). ``renewed``: recreated topics the
    reset sets (their record times were the deleted topics')."""
    name = command.pipeline
    number = found.ledger.batch + 1 if found else 1
    start = dict(found.ledger.offsets) if found else dict(new)
    base = found.ledger if found else None
    batch = Batch(
        number=number,
        base=base,
        start=start,
        end=new,
        cluster_id=view.cluster_id,
        reset_id=command.reset_id,
        topic_ids=_topic_ids(command.target, base, view),
    )
    carried_over = batch.ledger({tp: ts for tp, ts in timestamps.items() if tp in new})
    ledger = replace(
        carried_over,
        start_offsets=new,
        resets=(*carried(base), AppliedReset(command.reset_id, _moves(base, new)))[-RESET_MEMORY:],
        origin=carried_origin(base, new),
        timestamps={tp: ts for tp, ts in carried_over.timestamps.items() if tp.topic not in renewed},
        caught_up={tp: when for tp, when in carried_over.caught_up.items() if tp.topic not in renewed},
    )
    request = RowsCommit(
        name,
        batch,
        ledger,
        files,
        BatchCounts(dead_letters=sum(f.record_count for f in files)),
        command.max_attempts,
        command.extra(recovering),
        recovering=recovering,
    )
    outcome = commit_rows(table, request)
    if outcome.decision is Decision.FENCED:
        applied = applied_reset(table, name, command.reset_id)
        if applied is not None:  # an identical copy of this command landed first
            return applied, number
        raise FatalError(
            f"reset {command.reset_id} not applied: another writer committed to {table.identifier} meanwhile. "
            "Stop the scheduled runs of this pipeline and run the reset again."
        )
    return outcome.snapshot_id, number


def _sets(target: ResetTarget, view: KafkaView) -> set[str]:
    """The topics whose offsets ``target`` states: those ``--to-offsets`` names, else every topic."""
    if target.kind == "offsets":
        assert target.offsets is not None
        return {tp.topic for tp in target.offsets}
    return {tp.topic for tp in view.partitions}


def _topic_ids(target: ResetTarget, base: Ledger | None, view: KafkaView) -> dict[str, str]:
    """The topic ids the reset's ledger records: Kafka's of the topics it sets (a recreated topic's
    new id, once the operator has said where to read it from), the ledger's of the others."""
    sets = _sets(target, view) if base is not None else set(view.topic_ids)
    return {**(base.topic_ids if base is not None else {}), **{t: i for t, i in view.topic_ids.items() if t in sets}}


def _moves(base: Ledger | None, new: Mapping[TopicPartition, int]) -> tuple[tuple[TopicPartition, int, int], ...]:
    if base is None:
        return ()
    return tuple((tp, base.offsets[tp], o) for tp, o in sorted(new.items()) if base.offsets.get(tp, o) != o)


def _from_table(
    pipeline: Pipeline, command: ResetCommand, found: Found | None, lost: bool, dead_lost: bool
) -> ResetResult:
    """Rebuild whichever ledger is lost (rows, dead letters or both) from the tables' data."""
    name = pipeline.config.pipeline
    if not lost and not dead_lost:
        applied = applied_reset(pipeline.rows, name, command.reset_id) or applied_reset(
            pipeline.dead, name, command.reset_id
        )
        if applied is not None:
            return command.report("already-applied", applied)
        return command.report(
            "not-needed",
            found.snapshot_id if found else None,
            note=f"both ledgers of {name!r} are intact: nothing to rebuild (--to-offsets and the others move it)",
        )
    view = pipeline.source.describe()
    topics = pipeline.config.topics_in(tp.topic for tp in view.partitions)
    last_row, row_times = _newest(pipeline.rows, records.ROWS, topics)
    last_dead, dead_times = _newest(pipeline.dead, records.DEAD_LETTERS, topics)
    check_coordinates(last_row, last_dead, view)
    unseen: Sequence[TopicPartition] = ()
    if lost:
        rebuilt = rebuild_offsets(last_row, last_dead, view)
        new, unseen = rebuilt.offsets, rebuilt.unseen
        _check_retained(view, new, _retention_hint(view, new))
    else:
        assert found is not None
        new = found.ledger.offsets
    more: dict[str, Any] = {"by": command.by, "reason": command.reason, "recovered": lost}
    snapshot_id = None
    # a crash between a batch's two commits left its dead letters in files, and the ledger that
    # named them is lost: those below the rebuilt ledger go in with the floor (or on their own)
    owed = unadded(pipeline.rows, pipeline.dead, name, new) if lost else None
    if owed is not None and not dead_lost:
        _add_unadded(pipeline, command, *owed)
        owed = None
    if dead_lost:
        # first: a crash before the rows commit leaves the rows ledger lost, and the same command
        # then finds the floor in place and finishes
        floor = rebuild_floor(new, last_dead)
        files = pipeline.dead.write(owed[1]) if owed is not None else []
        floor_snapshot, _ = _commit(command, pipeline.dead, None, floor, view, {}, recovering=True, files=files)
        more["dead_letter_floor"] = FloorRebuilt(floor_snapshot, floor)
        snapshot_id = floor_snapshot
    if lost:
        # the newest dead letter's time counts only if it lies inside the rebuilt ranges
        timestamps = dict(row_times)
        for tp, when in dead_times.items():
            if last_dead[tp] < new[tp]:
                timestamps[tp] = max(timestamps.get(tp, when), when)
        snapshot_id, more["batch"] = _commit(command, pipeline.rows, None, new, view, timestamps, recovering=True)
    more["offsets"] = tuple(
        OffsetMove(
            tp.topic,
            tp.partition,
            found.ledger.offsets.get(tp) if found else None,
            o,
            "low-watermark" if tp in unseen else ("table" if lost else "ledger"),
        )
        for tp, o in sorted(new.items())
    )
    return command.report("applied", snapshot_id, **more)


def _add_unadded(pipeline: Pipeline, command: ResetCommand, sync: DeadLetterSync, dead_letters: pa.Table) -> None:
    """Add ``dead_letters`` (a batch's, left in files by a crash; see :func:`ingest.dead_letters.unadded`)
    to the intact dead-letter table, once: its ledger then remembers the batch's marker."""
    name, dead = pipeline.config.pipeline, pipeline.dead
    files = dead.write(dead_letters)

    def attempt(number: int) -> None:
        found = observe(dead, name)
        if found is None or found.ledger.remembers(sync.sync_id):
            return
        ledger = replace(found.ledger, batch=found.ledger.batch + 1, resets=remembering(found.ledger, sync.sync_id))
        summary = encode(name, ledger, BatchCounts(dead_letters=dead_letters.num_rows), {"synced-by": sync.sync_id})
        dead.try_commit(files, summary, {})

    with_retries(
        attempt,
        command.max_attempts,
        lambda: CommitGaveUp(
            f"adding the dead letters a crash left in files to {dead.identifier} did not settle after "
            f"{command.max_attempts} attempts; run the same reset again"
        ),
        f"dead letters {sync.sync_id} to {dead.identifier}",
    )


def _retention_hint(view: KafkaView, new: Mapping[TopicPartition, int]) -> str:
    below = {tp: view.partitions[tp].low for tp, o in new.items() if o < view.partitions[tp].low}
    if not below:
        return ""
    return (
        ". Kafka no longer holds the records right after the newest row of those partitions, so the tables "
        "cannot tell whether they were ingested (as dead letters) or not. To resume at the earliest retained "
        f"offset instead, accepting that loss, run: ingest reset --to-offsets {_spec({**new, **below})} --reason ..."
    )


def _newest(
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
