"""What became of one batch, as a run reports it (a line of ``--json``, a row of the summary)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: what became of a batch: committed now, found already landed (an earlier attempt whose
#: acknowledgement was lost, or an identical copy), or nothing to do
BatchStatus = Literal["committed", "landed", "empty"]


@dataclass(frozen=True)
class BatchResult:
    pipeline: str
    batch: int
    status: BatchStatus
    snapshot_id: int | None
    records: int = 0
    dead_letters: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ranges: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: records with JSON fields the table does not declare (dropped, captured or dead letters: ``unknown_fields``)
    unknown_fields: int = 0
    #: commit attempts that had to observe again, by why: ``conflict``, ``unknown`` (see
    #: :data:`ingest.retry.RETRIED`) and ``fenced`` (the batch was planned again)
    retries: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "pipeline": self.pipeline,
            "batch": self.batch,
            "status": self.status,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "dead_letters": self.dead_letters,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "ranges": [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in self.ranges],
            "unknown_fields": self.unknown_fields,
            "commit_retries": dict(self.retries),
        }
