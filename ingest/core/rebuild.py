"""Rebuilding a lost ledger from the Kafka coordinates the tables themselves hold.

Every record of every range a pipeline committed is in the rows table or in the dead-letter table,
each with its topic, partition and offset. That makes a lost ledger recoverable from the data:

* **rows ledger**: per partition, one past the newest offset in the rows table. Dead letters above
  that offset are not counted: they may be the last records of a committed range, or the dead
  letters of a batch whose rows commit never landed (a crash between the two commits), whose good
  records are in neither table. Resuming after the newest row re-reads both kinds; the dead letters
  among them are looked up before they are stored (below the floor), so none is stored twice, and
  the good records land once. Offsets after the newest row that hold no record (transaction markers, aborted
  records) are only read again. A partition without rows resumes at its low watermark: none of
  the records Kafka holds for it is in the rows table.
* **dead-letter floor** (see :class:`ingest.core.commit.DeadLetterStep`): per partition, the
  larger of the rows ledger and one past the newest stored dead letter: no dead letter lies at or
  above it, which is all a floor says (a batch looks up its dead letters below it).

Offsets are "next offset to read", as everywhere. Pure: the caller passes what it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ingest.core.ledger import TopicPartition
from ingest.core.plan import KafkaView
from ingest.errors import TopicRecreated


@dataclass(frozen=True)
class Rebuilt:
    """A rows ledger rebuilt from the tables."""

    #: next offset to read, for every partition Kafka has
    offsets: Mapping[TopicPartition, int]
    #: partitions with no row in the table: they resume at their low watermark
    unseen: tuple[TopicPartition, ...]


def check_coordinates(
    last_row: Mapping[TopicPartition, int], last_dead: Mapping[TopicPartition, int], kafka: KafkaView
) -> None:
    """Fail if the tables hold offsets this Kafka cluster does not: the topic was recreated.

    ``last_row`` and ``last_dead`` are the newest offset stored per partition (not "next").
    """
    problems = []
    for label, last in (("rows", last_row), ("dead-letter", last_dead)):
        for tp, offset in sorted(last.items()):
            wm = kafka.partitions.get(tp)
            if wm is None:
                problems.append(f"the {label} table holds records of {tp}, which Kafka does not have")
            elif offset >= wm.high:
                problems.append(f"the {label} table holds {tp} offset {offset}, but the partition ends at {wm.high}")
    if problems:
        raise TopicRecreated(
            "cannot rebuild the ledger from the tables: "
            + "; ".join(problems)
            + ". The topic was deleted and recreated, so the stored offsets do not apply to it. "
            "Start a new pipeline id, or set the ledger explicitly with `ingest reset --to-offsets`."
        )


def rebuild_offsets(
    last_row: Mapping[TopicPartition, int], last_dead: Mapping[TopicPartition, int], kafka: KafkaView
) -> Rebuilt:
    """The rows ledger the tables prove: one past the newest row, else the low watermark."""
    check_coordinates(last_row, last_dead, kafka)
    offsets = {}
    unseen = []
    for tp, wm in sorted(kafka.partitions.items()):
        if tp in last_row:
            offsets[tp] = last_row[tp] + 1
        else:
            offsets[tp] = wm.low
            unseen.append(tp)
    return Rebuilt(offsets, tuple(unseen))


def rebuild_floor(
    ledger: Mapping[TopicPartition, int], last_dead: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The dead-letter floor: per partition, max(rows ledger, one past the newest dead letter)."""
    floor = dict(ledger)
    for tp, offset in last_dead.items():
        floor[tp] = max(floor.get(tp, offset + 1), offset + 1)
    return floor
