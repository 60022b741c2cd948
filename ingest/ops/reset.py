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
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ingest import records
from ingest.assembly import Opened
from ingest.committer import RowsCommit, commit_rows, ledger_lost, observe
from ingest.core.commit import Decision
from ingest.core.ledger import (
    RESET_MEMORY,
    AppliedReset,
    BatchCounts,
    Found,
    Ledger,
    TopicPartition,
    carried,
    carried_origin,
    carried_reads,
)
from ingest.core.ledger_codec import find_ledger, read_extra
from ingest.core.plan import Batch, KafkaView, changed_topics
from ingest.core.rebuild import check_coordinates, rebuild_floor, rebuild_offsets
from ingest.dead_letters import settle
from ingest.errors import ConfigError, FatalError
from ingest.intents import DataFile
from ingest.ops.reset_command import (
    FloorRebuilt,
    OffsetMove,
    OffsetsSource,
    ResetCommand,
    ResetResult,
    ResetTarget,
    default_reset_id,
    offsets_spec,
)
from ingest.ops.stored import add_unadded, newest_coordinates, unadded
from ingest.ports import LedgerTable


def reset(pipeline: Opened, target: ResetTarget, reason: str, reset_id: str | None = None) -> ResetResult:
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
        read=carried_reads(base),  # a reset moves the ledger, it reads nothing
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
    pipeline: Opened, command: ResetCommand, found: Found | None, lost: bool, dead_lost: bool
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
    last_row, row_times = newest_coordinates(pipeline.rows, records.ROWS, topics)
    last_dead, dead_times = newest_coordinates(pipeline.dead, records.DEAD_LETTERS, topics)
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
        add_unadded(pipeline.dead, name, *owed, command.max_attempts)
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


def _retention_hint(view: KafkaView, new: Mapping[TopicPartition, int]) -> str:
    below = {tp: view.partitions[tp].low for tp, o in new.items() if o < view.partitions[tp].low}
    if not below:
        return ""
    return (
        ". Kafka no longer holds the records right after the newest row of those partitions, so the tables "
        "cannot tell whether they were ingested (as dead letters) or not. To resume at the earliest retained "
        "offset instead, accepting that loss, run: ingest reset --to-offsets "
        f"{offsets_spec({**new, **below})} --reason ..."
    )
