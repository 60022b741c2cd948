"""``ingest reset``: move a pipeline's ledger without data, recorded and applied exactly once.

The reset is a snapshot with no data files whose summary carries the new ledger and who/why
(``reset-id``, ``reset-by``, ``reset-reason``). Its id defaults to a hash of the command (pipeline,
target, reason), so an orchestrator re-running the same command finds it already applied and does
not move the ledger twice; pass ``--reset-id`` to make a deliberate repeat distinct.
"""

from __future__ import annotations

import getpass
import hashlib
import socket
from dataclasses import dataclass
from typing import Any

from ingest.committer import commit_rows
from ingest.core.commit import Decision
from ingest.core.ledger import BatchCounts, Ledger, TopicPartition, read_extra
from ingest.core.plan import Batch
from ingest.errors import ConfigError, FatalError
from ingest.pipeline import Pipeline


@dataclass(frozen=True)
class ResetTarget:
    """Exactly one of: explicit offsets, earliest, latest, or a timestamp (ms)."""

    kind: str  # offsets | earliest | latest | timestamp
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


def reset(pipeline: Pipeline, target: ResetTarget, reason: str, reset_id: str | None = None) -> dict[str, Any]:
    name = pipeline.config.pipeline
    reset_id = reset_id or hashlib.sha256(f"{name}|{target.describe()}|{reason}".encode()).hexdigest()[:16]
    found = pipeline.ledger()
    for snap in pipeline.rows.ancestry():
        if read_extra(name, snap.summary, "reset-id") == reset_id:
            return {
                "pipeline": name,
                "reset_id": reset_id,
                "status": "already-applied",
                "snapshot_id": snap.snapshot_id,
            }
    view = pipeline.source.describe()
    current = dict(found.ledger.offsets) if found else {}
    if target.kind == "offsets":
        assert target.offsets is not None
        unknown = sorted(set(target.offsets) - set(view.partitions))
        if unknown:
            raise ConfigError(f"--to-offsets names partitions Kafka does not have: {', '.join(map(str, unknown))}")
        new = {**current, **target.offsets}
        for tp in view.partitions:
            new.setdefault(tp, view.partitions[tp].low)
    elif target.kind == "earliest":
        new = {tp: wm.low for tp, wm in view.partitions.items()}
    elif target.kind == "latest":
        new = {tp: wm.high for tp, wm in view.partitions.items()}
    else:
        assert target.timestamp_ms is not None
        new = pipeline.source.offsets_for_time(sorted(view.partitions), target.timestamp_ms)
        new = {tp: (o if o >= 0 else view.partitions[tp].high) for tp, o in new.items()}
    outside = [
        f"{tp} offset {o} (retained [{view.partitions[tp].low}, {view.partitions[tp].high}])"
        for tp, o in sorted(new.items())
        if not view.partitions[tp].low <= o <= view.partitions[tp].high
    ]
    if outside:
        raise FatalError("reset refused, offsets outside what Kafka holds: " + "; ".join(outside))
    number = found.ledger.batch + 1 if found else 1
    batch = Batch(
        number=number, base=found.ledger if found else None, start=current or new, end=new, cluster_id=view.cluster_id
    )
    ledger = Ledger(
        batch=number,
        offsets=new,
        start_offsets=new,
        cluster_id=view.cluster_id,
        timestamps=found.ledger.timestamps if found else {},
    )
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    extra = {"reset-id": reset_id, "reset-by": who, "reset-reason": reason, "reset-target": target.describe()}
    outcome = commit_rows(
        pipeline.rows, name, batch, ledger, [], BatchCounts(), pipeline.config.commit.max_attempts, extra
    )
    if outcome.decision is Decision.FENCED:
        raise FatalError(
            f"reset {reset_id} not applied: another writer committed to {pipeline.config.table} meanwhile. "
            "Stop the scheduled runs of this pipeline and run the reset again."
        )
    return {
        "pipeline": name,
        "reset_id": reset_id,
        "status": "applied",
        "snapshot_id": outcome.snapshot_id,
        "batch": number,
        "by": who,
        "reason": reason,
        "offsets": [
            {"topic": tp.topic, "partition": tp.partition, "from": current.get(tp), "to": o}
            for tp, o in sorted(new.items())
        ],
    }
