"""What an ``ingest reset`` is and what it reports: its target (``--to-offsets``, ``--to-earliest``,
``--to-latest``, ``--to-timestamp``, ``--from-table``), the command with its id, and the result."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ingest.core.ledger import TopicPartition
from ingest.core.plan import KafkaView
from ingest.errors import ConfigError

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


def offsets_spec(offsets: Mapping[TopicPartition, int]) -> str:
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
