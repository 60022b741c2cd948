"""The ledger in Iceberg snapshot summaries: its codec, and the lookup along a branch's ancestry.

A ledger (:mod:`ingest.core.ledger`) travels in the summary of the snapshot that committed it, under
keys scoped by the pipeline id (``ingest.<pipeline>.*``): this module encodes and decodes it (its
format versions, the dead-letter marker, a batch's counts and audit keys), names the other keys this
project writes in summaries and table properties (maintenance markers, the registry of pipelines),
and finds a pipeline's newest ledger walking back from a branch head. Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ingest.core.ledger import (
    RESET_MEMORY,
    AppliedReset,
    BatchCounts,
    DeadLetterSync,
    Found,
    Ledger,
    LostRange,
    SnapshotView,
    TopicPartition,
)
from ingest.errors import LedgerFormatError

#: the ledger format this version writes; formats 1 (every map nested per partition) and 2 (no topic
#: ids, no caught-up times) are still read. A version that reads only older formats stops at a newer ledger instead of
#: dropping what it cannot read (the topic ids) from the ledgers it commits
FORMAT_VERSION = 3
#: the format of a ledger whose snapshot owes the dead-letter table a batch's dead letters: a
#: version that cannot add them must not commit on top of it, so it refuses the ledger instead
OWES_DEAD_LETTERS_FORMAT = 4
READABLE_FORMATS = (1, 2, 3, 4)
#: every summary key and table property this project writes starts with this
PREFIX = "ingest."
REGISTRY_PROPERTY = f"{PREFIX}pipelines"
#: table properties the pipeline sets on the tables it creates: its commits settle by observing
#: the ledger, so pyiceberg's own retries (which could append a batch twice) are off
PIPELINE_TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
#: a snapshot ``ingest maintain`` made (its value: the operation, e.g. ``compaction``)
MAINTENANCE_KEY = f"{PREFIX}maintenance"
COMPACTION = "compaction"
#: a snapshot ``ingest replay --publish`` re-applied onto a branch (its value: the original's id)
REAPPLIED_FROM_KEY = f"{PREFIX}reapplied-from"


@dataclass(frozen=True)
class Detail:
    """What a ledger's ``detail`` key holds."""

    starts: dict[TopicPartition, int]
    timestamps: dict[TopicPartition, int]
    origin: dict[TopicPartition, int]
    topic_ids: dict[str, str]
    caught_up: dict[TopicPartition, int]
    read: dict[TopicPartition, tuple[tuple[int, int], ...]] | None = None


def _key(pipeline: str, name: str) -> str:
    return f"ingest.{pipeline}.{name}"


def _nested(offsets: Mapping[TopicPartition, int]) -> dict[str, list[int] | dict[str, int]]:
    """``{"topic": [o0, o1, ...]}`` when a topic's partitions are 0..n-1 (the usual case), else
    ``{"topic": {"p": o}}`` (format 1 wrote the second form for every topic)."""
    grouped: dict[str, dict[int, int]] = {}
    for tp in sorted(offsets):
        grouped.setdefault(tp.topic, {})[tp.partition] = offsets[tp]
    return {
        topic: list(parts.values()) if list(parts) == list(range(len(parts))) else {str(p): o for p, o in parts.items()}
        for topic, parts in grouped.items()
    }


def _encode_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(_nested(offsets), separators=(",", ":"), sort_keys=True)


def _decode_offsets(text: str) -> dict[TopicPartition, int]:
    return _offsets_of(json.loads(text))


def _offsets_of(nested: Mapping[str, list[int] | Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        TopicPartition(topic, int(partition)): int(offset)
        for topic, partitions in nested.items()
        for partition, offset in (enumerate(partitions) if isinstance(partitions, list) else partitions.items())
    }


def _encode_detail(ledger: Ledger) -> str:
    """Start offsets, timestamps, origin, topic ids and caught-up times in one compressed key
    (formats 2 and 3): at 1,000 partitions they were ~50 KB of a snapshot's summary, which every
    snapshot kept in the table metadata repeats.

    zlib over JSON, base64: each start as its distance below the partition's offset (the batch's
    size), the timestamps and caught-up times after their minimum; decompressed, it reads as plain JSON."""
    reads = {tp: ledger.offsets[tp] - start for tp, start in ledger.start_offsets.items() if tp in ledger.offsets}
    starts = {tp: start for tp, start in ledger.start_offsets.items() if tp not in ledger.offsets}
    base = min(ledger.timestamps.values(), default=0)
    caught_base = min(ledger.caught_up.values(), default=0)
    detail = {
        "read": _nested(reads),
        "start": _nested(starts),
        "time-base": base,
        "times": _nested({tp: ts - base for tp, ts in ledger.timestamps.items()}),
        "origin": _nested(ledger.origin),
        "topic-ids": dict(sorted(ledger.topic_ids.items())),
        "caught-up-base": caught_base,
        "caught-up": _nested({tp: when - caught_base for tp, when in ledger.caught_up.items()}),
    }
    if ledger.read is not None:
        # what the line read, but where it is all of [origin, offset) (a line without resets): implied
        read = {tp: tuple(ledger.read.get(tp, ())) for tp in {*ledger.offsets, *ledger.read}}
        detail["read-spans"] = _encode_spans(
            {tp: spans for tp, spans in read.items() if spans != _implied(tp, ledger.origin, ledger.offsets)}
        )
    text = json.dumps(detail, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(zlib.compress(text, 9)).decode("ascii")


def _decode_detail(pipeline: str, text: str, offsets: Mapping[TopicPartition, int]) -> Detail:
    """The detail of a format-2 or -3 ledger (format 2 has no topic ids nor caught-up times)."""
    try:
        detail = json.loads(zlib.decompress(base64.b64decode(text, validate=True)))
        starts = {tp: offsets[tp] - read for tp, read in _offsets_of(detail["read"]).items()}
        starts |= _offsets_of(detail["start"])
        base = int(detail["time-base"])
        timestamps = {tp: base + delta for tp, delta in _offsets_of(detail["times"]).items()}
        topic_ids = {str(topic): str(topic_id) for topic, topic_id in detail.get("topic-ids", {}).items()}
        caught_base = int(detail.get("caught-up-base", 0))
        caught_up = {tp: caught_base + delta for tp, delta in _offsets_of(detail.get("caught-up", {})).items()}
        spans = detail.get("read-spans")
        origin = _offsets_of(detail["origin"])
        read = None
        if spans is not None:
            implied = {tp: _implied(tp, origin, offsets) for tp in offsets}
            read = {tp: s for tp, s in implied.items() if s is not None} | _decode_spans(spans)
        return Detail(starts, timestamps, origin, topic_ids, caught_up, read)
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error) as error:
        raise LedgerFormatError(
            f"'ingest.{pipeline}.detail' is not the zlib-compressed JSON this version writes: corrupted ledger "
            f"({type(error).__name__}: {error})"
        ) from None


def encode(
    pipeline: str, ledger: Ledger, counts: BatchCounts, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Snapshot summary properties carrying the full ledger (every partition, idle ones too).

    ``extra`` adds audit keys under the same scope (e.g. ``reset-id``, ``reset-reason``).
    """
    props = {_key(pipeline, name): value for name, value in (extra or {}).items()}
    props |= {
        _key(pipeline, "format"): str(
            OWES_DEAD_LETTERS_FORMAT if ledger.sync is not None and ledger.sync.files is not None else FORMAT_VERSION
        ),
        _key(pipeline, "batch"): str(ledger.batch),
        _key(pipeline, "offsets"): _encode_offsets(ledger.offsets),
        _key(pipeline, "detail"): _encode_detail(ledger),
        _key(pipeline, "records"): str(counts.records),
        _key(pipeline, "dead-letters"): str(counts.dead_letters),
        _key(pipeline, "bytes"): str(counts.bytes),
    }
    if counts.unknown_fields:
        props[_key(pipeline, "unknown-fields")] = str(counts.unknown_fields)
    if ledger.cluster_id is not None:
        props[_key(pipeline, "kafka-cluster")] = ledger.cluster_id
    valid_through = ledger.valid_through
    if valid_through is not None:
        props[_key(pipeline, "valid-through")] = str(valid_through)
    if ledger.lost:
        props[_key(pipeline, "lost-ranges")] = json.dumps(
            [[r.tp.topic, r.tp.partition, r.start, r.end] for r in ledger.lost], separators=(",", ":")
        )
    if ledger.reset_id is not None:
        props[_key(pipeline, "reset-id")] = ledger.reset_id
    if ledger.resets:
        resets = [
            [r.reset_id, [[tp.topic, tp.partition, was, to] for tp, was, to in r.moves]]
            for r in ledger.resets[-RESET_MEMORY:]
        ]
        props[_key(pipeline, "resets")] = json.dumps(resets, separators=(",", ":"))
    if ledger.sync is not None:
        props[_key(pipeline, "dead-letter-sync")] = encode_sync(ledger.sync)
    return props


def encode_sync(marker: DeadLetterSync) -> str:
    """A marker as the JSON text a snapshot summary (or a table property) carries."""
    sync: dict[str, object] = {"id": marker.sync_id, "branch": marker.branch}
    if marker.rewind_to is not None:
        sync["rewind-to"] = _nested(marker.rewind_to)
    if marker.rewind_gaps:
        sync["rewind-gaps"] = _encode_spans(marker.rewind_gaps)
    if marker.redriven is not None:
        sync["redriven"] = _encode_spans(marker.redriven)
    if marker.files is not None:
        sync["files"] = list(marker.files)
        sync["count"] = marker.count
    return json.dumps(sync, separators=(",", ":"), sort_keys=True)


def owed_property(pipeline: str) -> str:
    """The rows table's property that repeats the marker of ``pipeline``'s newest batch with dead
    letters: table properties survive snapshot expiry, so ``ingest reset --from-table`` still finds
    the files of dead letters a crash left unadded once another tool expired the ledger's snapshots."""
    return _key(pipeline, "dead-letters-owed")


def decode_sync(text: str | None) -> DeadLetterSync | None:
    """The marker :func:`encode_sync` wrote (None for None)."""
    if text is None:
        return None
    data = json.loads(text)
    rewind = data.get("rewind-to")
    gaps = data.get("rewind-gaps")
    redriven = data.get("redriven")
    files = data.get("files")
    return DeadLetterSync(
        data["id"],
        data.get("branch"),
        _offsets_of(rewind) if rewind is not None else None,
        _decode_spans(redriven) if redriven is not None else None,
        tuple(str(path) for path in files) if files is not None else None,
        int(data.get("count", 0)),
        _decode_spans(gaps) if gaps is not None else None,
    )


def _implied(
    tp: TopicPartition, origin: Mapping[TopicPartition, int], offsets: Mapping[TopicPartition, int]
) -> tuple[tuple[int, int], ...] | None:
    """What a partition's line read when nothing says otherwise: all of ``[origin, offset)``; None
    where its origin or offset is not known."""
    if tp not in origin or tp not in offsets:
        return None
    return ((origin[tp], offsets[tp]),) if offsets[tp] > origin[tp] else ()


def _encode_spans(spans: Mapping[TopicPartition, Sequence[tuple[int, int]]]) -> dict[str, dict[str, list[list[int]]]]:
    """``{"topic": {"partition": [[start, end], ...]}}``."""
    nested: dict[str, dict[str, list[list[int]]]] = {}
    for tp, ranges in sorted(spans.items()):
        nested.setdefault(tp.topic, {})[str(tp.partition)] = [[lo, hi] for lo, hi in ranges]
    return nested


def _decode_spans(
    nested: Mapping[str, Mapping[str, Sequence[Sequence[int]]]],
) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    return {
        TopicPartition(topic, int(partition)): tuple((int(lo), int(hi)) for lo, hi in ranges)
        for topic, partitions in nested.items()
        for partition, ranges in partitions.items()
    }


def _decode_resets(text: str) -> tuple[AppliedReset, ...]:
    return tuple(
        AppliedReset(reset_id, tuple((TopicPartition(t, int(p)), int(was), int(to)) for t, p, was, to in moves))
        for reset_id, moves in json.loads(text)
    )


def decode(pipeline: str, summary: Mapping[str, str]) -> Ledger | None:
    """The ledger in one snapshot summary, or None if the snapshot is not this pipeline's."""
    offsets = summary.get(_key(pipeline, "offsets"))
    version_text = summary.get(_key(pipeline, "format"))
    if offsets is None and version_text is None:
        return None
    version = int(version_text or 1)
    if version not in READABLE_FORMATS:
        raise LedgerFormatError(
            f"snapshot summary has ledger format {version} for pipeline {pipeline!r}; this version of "
            f"lakehouse-ingest reads formats {', '.join(map(str, READABLE_FORMATS))}. Upgrade lakehouse-ingest."
        )
    if offsets is None:
        raise LedgerFormatError(f"snapshot summary has 'ingest.{pipeline}.format' but no offsets: corrupted ledger")
    lost_text = summary.get(_key(pipeline, "lost-ranges"))
    lost = tuple(LostRange(TopicPartition(t, int(p)), int(s), int(e)) for t, p, s, e in json.loads(lost_text or "[]"))
    next_offsets = _decode_offsets(offsets)
    detail = summary.get(_key(pipeline, "detail"))
    if detail is not None:
        kept = _decode_detail(pipeline, detail, next_offsets)
    else:  # format 1
        kept = Detail(
            _decode_offsets(summary.get(_key(pipeline, "start-offsets"), "{}")),
            _decode_offsets(summary.get(_key(pipeline, "timestamps"), "{}")),
            _decode_offsets(summary.get(_key(pipeline, "origin"), "{}")),
            {},
            {},
        )
    return Ledger(
        batch=int(summary[_key(pipeline, "batch")]),
        offsets=next_offsets,
        start_offsets=kept.starts,
        cluster_id=summary.get(_key(pipeline, "kafka-cluster")),
        timestamps=kept.timestamps,
        lost=lost,
        reset_id=summary.get(_key(pipeline, "reset-id")),
        resets=_decode_resets(summary.get(_key(pipeline, "resets"), "[]")),
        sync=decode_sync(summary.get(_key(pipeline, "dead-letter-sync"))),
        origin=kept.origin,
        topic_ids=kept.topic_ids,
        caught_up=kept.caught_up,
        read=kept.read,
    )


def read_extra(pipeline: str, summary: Mapping[str, str], name: str) -> str | None:
    """An audit key written with :func:`encode`'s ``extra``."""
    return summary.get(_key(pipeline, name))


def decode_counts(pipeline: str, summary: Mapping[str, str]) -> BatchCounts:
    return BatchCounts(
        records=int(summary.get(_key(pipeline, "records"), "0")),
        dead_letters=int(summary.get(_key(pipeline, "dead-letters"), "0")),
        bytes=int(summary.get(_key(pipeline, "bytes"), "0")),
        unknown_fields=int(summary.get(_key(pipeline, "unknown-fields"), "0")),
    )


def find_ledger(pipeline: str, ancestry: Iterable[SnapshotView]) -> Found | None:
    """First snapshot, walking back from the branch head, that carries this pipeline's ledger.

    Snapshots of other writers (compaction, deletes, other pipelines) lack the key and are
    skipped. ``ancestry`` ends where the parent chain ends or breaks (expiry can remove parents).
    """
    for snap in ancestry:
        ledger = decode(pipeline, snap.summary)
        if ledger is not None:
            return Found(snap.snapshot_id, ledger)
    return None


def offsets_key(pipeline: str) -> str:
    """The summary key whose presence marks a snapshot as carrying ``pipeline``'s ledger."""
    return _key(pipeline, "offsets")


def ours(summary: Mapping[str, str]) -> dict[str, str]:
    """The summary keys this project wrote (every pipeline's ledger, markers), and nothing else."""
    return {k: v for k, v in summary.items() if k.startswith(PREFIX)}


def registered_pipelines(properties: Mapping[str, str]) -> list[str]:
    """Pipelines that ever committed to a table (table properties survive snapshot expiry)."""
    text = properties.get(REGISTRY_PROPERTY, "")
    return [name for name in text.split(",") if name]


def register(properties: Mapping[str, str], pipeline: str) -> dict[str, str]:
    """Property updates that add ``pipeline`` to the registry; empty if it is there already."""
    names = registered_pipelines(properties)
    if pipeline in names:
        return {}
    return {REGISTRY_PROPERTY: ",".join([*names, pipeline])}
