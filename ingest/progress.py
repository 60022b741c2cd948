"""How far a run is while it runs: a catch-up's records and bytes, rate, lag left and ETA, and the
batch in flight (records read and decoded, data files written).

The batch loop (:meth:`ingest.pipeline.Pipeline.run`) says where a catch-up starts and ends and
what each batch planned and became; an engine says, chunk by chunk and from any thread, what it
read and wrote (:meth:`Progress.advanced`; the local engine's workers through their connection,
Spark by tasks done). Whoever shows a run reads :meth:`Progress.figures`: a terminal's live
display, the progress log line of a run without one, the metrics' in-flight gauges.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ingest.core.ledger import TopicPartition

#: an engine's word on the batch in flight: records read and decoded, their bytes, data files
#: written, since its last word
Advanced = Callable[[int, int, int], None]


@dataclass(frozen=True)
class Figures:
    """A run's progress at one moment (:meth:`Progress.figures`)."""

    pipeline: str
    table: str
    #: records (rows and dead letters) and bytes committed since the catch-up began
    records: int
    bytes: int
    elapsed_s: float
    #: records per second since the catch-up began, the batch in flight's included
    rate: float
    #: per topic, records between the ledger and the end offsets the catch-up aims at (None: a run
    #: of one batch aims at no end)
    lag: Mapping[str, int] | None
    #: seconds until the lag is in at the current rate (None: unknown)
    eta_s: float | None
    #: the batch in flight (None between batches), what it planned and has read, decoded and written
    batch: int | None = None
    batch_planned: int = 0
    batch_done: int = 0
    batch_bytes: int = 0
    chunks: int = 0
    files: int = 0

    @property
    def lag_total(self) -> int | None:
        return sum(self.lag.values()) if self.lag is not None else None

    def as_dict(self) -> dict[str, object]:
        return {
            "pipeline": self.pipeline,
            "table": self.table,
            "records": self.records,
            "bytes": self.bytes,
            "elapsed_s": round(self.elapsed_s, 1),
            "records_per_s": round(self.rate),
            "lag": dict(self.lag) if self.lag is not None else None,
            "eta_s": round(self.eta_s) if self.eta_s is not None else None,
            "batch": self.batch,
            "batch_planned": self.batch_planned,
            "batch_done": self.batch_done,
            "chunks": self.chunks,
            "files": self.files,
        }

    def text(self) -> str:
        """One line for a log: what is done, how fast, what is left, and the batch in flight."""
        parts = [f"{self.pipeline}: {self.records:,} records ({self.bytes / 1e6:,.1f} MB) in {clock(self.elapsed_s)}"]
        parts.append(f"{self.rate:,.0f} records/s")
        if self.lag is not None:
            left = ", ".join(f"{topic} {n:,}" for topic, n in sorted(self.lag.items()))
            parts.append(f"lag {self.lag_total:,} ({left})" if len(self.lag) > 1 else f"lag {self.lag_total:,}")
            parts.append(f"ETA {clock(self.eta_s)}" if self.eta_s is not None else "ETA unknown")
        if self.batch is not None:
            parts.append(
                f"batch {self.batch}: {self.batch_done:,} of {self.batch_planned:,} records read, "
                f"{counted(self.chunks, 'chunk')} decoded, {counted(self.files, 'file')} written"
            )
        return "; ".join(parts)


def counted(n: int, thing: str) -> str:
    """``1 file``, ``2 files``."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def clock(seconds: float | None) -> str:
    """``1:02:03`` or ``2:03`` for a duration."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class _InFlight:
    number: int
    planned: int
    done: int = 0
    nbytes: int = 0
    chunks: int = 0
    files: int = 0


@dataclass
class Progress:
    """One table's catch-up as it goes; fed from the batch loop's thread and the engine's."""

    pipeline: str
    table: str
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: float = 0.0
    _records: int = 0
    _bytes: int = 0
    _committed: dict[TopicPartition, int] = field(default_factory=dict)
    _target: dict[TopicPartition, int] | None = None
    _batch: _InFlight | None = None

    def __post_init__(self) -> None:
        self._started = self.clock()

    def catching_up(self, committed: Mapping[TopicPartition, int], target: Mapping[TopicPartition, int] | None) -> None:
        """A catch-up begins from the ledger's ``committed`` offsets towards ``target`` (the end
        offsets Kafka showed; None for a run of one batch)."""
        with self._lock:
            self._started = self.clock()
            self._records = self._bytes = 0
            self._committed = dict(committed)
            self._target = dict(target) if target is not None else None
            self._batch = None

    def planned(self, number: int, ranges: Sequence[tuple[TopicPartition, int, int]]) -> None:
        """Batch ``number`` will read ``ranges`` (``[start, end)`` per partition)."""
        with self._lock:
            self._batch = _InFlight(number, sum(end - start for _, start, end in ranges))
            for tp, start, _ in ranges:  # where the ledger is, as the planner found it
                self._committed[tp] = start

    def advanced(self, records: int, nbytes: int, files: int) -> None:
        """The engine read and decoded ``records`` more (``nbytes``) and wrote ``files`` more (:data:`Advanced`)."""
        with self._lock:
            if self._batch is not None:
                self._batch.done += records
                self._batch.nbytes += nbytes
                self._batch.chunks += 1 if records else 0
                self._batch.files += files

    def ended(self, records: int, nbytes: int, ranges: Sequence[tuple[str, int, int, int]]) -> None:
        """The batch in flight ended: ``records`` (rows and dead letters) and ``nbytes`` committed,
        or found landed, over ``ranges`` (``(topic, partition, start, end)``); 0 for an empty one."""
        with self._lock:
            self._records += records
            self._bytes += nbytes
            for topic, partition, _, end in ranges:
                self._committed[TopicPartition(topic, partition)] = end
            self._batch = None

    def left(self) -> dict[TopicPartition, int] | None:
        """Per partition, records between the ledger and the end offset the catch-up aims at."""
        with self._lock:
            if self._target is None:
                return None
            return {tp: max(0, end - self._committed.get(tp, end)) for tp, end in self._target.items()}

    def figures(self) -> Figures:
        with self._lock:
            elapsed = max(self.clock() - self._started, 1e-9)
            batch = self._batch
            in_flight = batch.done if batch is not None else 0
            rate = (self._records + in_flight) / elapsed
            lag: dict[str, int] | None = None
            eta = None
            if self._target is not None:
                lag = {}
                for tp, end in self._target.items():
                    lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - self._committed.get(tp, end))
                left = max(0, sum(lag.values()) - in_flight)
                eta = left / rate if rate > 0 else (0.0 if left == 0 else None)
            return Figures(
                self.pipeline,
                self.table,
                self._records,
                self._bytes,
                elapsed,
                rate,
                lag,
                eta,
                batch.number if batch is not None else None,
                batch.planned if batch is not None else 0,
                in_flight,
                batch.nbytes if batch is not None else 0,
                batch.chunks if batch is not None else 0,
                batch.files if batch is not None else 0,
            )
