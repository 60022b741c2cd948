"""The one error hierarchy of lakehouse-ingest.

Every domain failure is an :class:`IngestError`, split into :class:`RetryableError` (running the
same command again later is the right move: a broker or catalog is unavailable, a concurrent
writer fenced this batch) and :class:`FatalError` (retrying cannot help: data loss, a lost ledger,
a mismatched table). :class:`ConfigError` is fatal too but gets its own exit code so an
orchestrator can tell "the job is broken" from "the data is in trouble".

Anything that is not an ``IngestError`` is a bug and is never treated as retryable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Process exit codes of the ``ingest`` CLI (sysexits.h values, documented in docs/usage.md)."""

    OK = 0
    #: unexpected error (a bug): not retryable
    INTERNAL = 1
    #: data problem: data loss, ledger lost, recreated topic, verify found a discrepancy
    FATAL = 65
    #: temporary failure: broker or catalog unavailable, fenced by a concurrent writer
    RETRYABLE = 75
    #: the configuration file is invalid
    CONFIG = 78


class IngestError(Exception):
    """Root of all lakehouse-ingest errors."""

    exit_code: ExitCode = ExitCode.FATAL
    retryable: bool = False


class RetryableError(IngestError):
    """Running the same command again later is safe and expected to succeed."""

    exit_code = ExitCode.RETRYABLE
    retryable = True


class FatalError(IngestError):
    """Retrying cannot help; a person has to look."""

    exit_code = ExitCode.FATAL


class ConfigError(FatalError):
    """The configuration is invalid; the message names the bad key."""

    exit_code = ExitCode.CONFIG


# --- retryable -------------------------------------------------------------------------------


class BrokerUnavailable(RetryableError):
    """Kafka could not be reached, or stopped answering mid-batch."""


class CatalogUnavailable(RetryableError):
    """The Iceberg catalog or object store could not be reached."""


class Fenced(RetryableError):
    """Another writer advanced this pipeline's ledger; this batch's files are orphans."""

    def __init__(self, pipeline: str, table: str, batch: int, observed_batch: int | None) -> None:
        self.pipeline, self.table, self.batch, self.observed_batch = pipeline, table, batch, observed_batch
        super().__init__(
            f"batch {batch} of pipeline {pipeline!r} was fenced on {table}: another writer committed "
            f"batch {observed_batch} first. Nothing was duplicated; run again to continue from the new ledger."
        )


class CommitGaveUp(RetryableError):
    """The commit loop could not settle the outcome within its bounded attempts."""


class CommitConflict(RetryableError):
    """The catalog refused the commit: the branch head was no longer the snapshot we required."""


class CommitUnknown(RetryableError):
    """The commit attempt failed in a way that does not say whether it was applied."""


class MainMoved(RetryableError):
    """Main moved while a rollback or publish was deciding; nothing was changed."""


class BranchGone(RetryableError):
    """The branch a command works on was removed meanwhile (a concurrent ``ingest replay --publish``
    published it, or someone dropped it); nothing this command committed is on main."""


class WorkerLost(RetryableError):
    """A worker process died or stopped answering during a batch; nothing was committed."""


class SchemaMoved(RetryableError):
    """The table's schema changed while a batch's files were written for an evolved one."""


class RegistryUnavailable(RetryableError):
    """The Schema Registry did not answer (down, unreachable, or an error on its side)."""


#: where records of a schema begin: (topic, partition, offset) of the first in each partition
Firsts = tuple[tuple[str, int, int], ...]


class SchemaAhead(RetryableError):
    """Records of a batch were written with a schema the table must evolve to take, and the batch
    was produced for the table's schema before it. ``schema_ids`` are those schemas' registry ids;
    ``key``: they are the records' key schemas (``key_format``), not their value schemas;
    ``first``: where the records of those schemas begin in the chunk that met them (the first one
    in each of its partitions; the message names them too, as :func:`firsts_text` writes them)."""

    def __init__(
        self, message: str, schema_ids: tuple[int, ...] = (), *, key: bool = False, first: Firsts = ()
    ) -> None:
        super().__init__(message)
        #: parsed back from the message when only the text crossed a process (Spark rebuilds errors from it)
        self.schema_ids = schema_ids or tuple(int(i) for i in re.findall(r"schema id (\d+)", message))
        self.key = key or KEYS_AHEAD in message  # Spark prefixes the task's message with its own
        self.first = first or tuple((t, int(p), int(o)) for t, p, o in _FIRST.findall(message))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_schema_ahead, (str(self), self.schema_ids, self.key, self.first))


#: how the message of a :class:`SchemaAhead` for keys starts
KEYS_AHEAD = "record keys: "
#: one place in :func:`firsts_text` (Kafka topic names are made of letters, digits, ``.``, ``_`` and ``-``)
_FIRST = re.compile(r"([\w.-]+)\[(\d+)\] at offset (\d+)")


def firsts_text(first: Firsts) -> str:
    """``first`` as a :class:`SchemaAhead` message names it: ``orders[0] at offset 12, orders[1] at offset 7``."""
    return ", ".join(f"{topic}[{partition}] at offset {offset}" for topic, partition, offset in first)


def _schema_ahead(message: str, schema_ids: tuple[int, ...], key: bool, first: Firsts) -> SchemaAhead:
    return SchemaAhead(message, schema_ids, key=key, first=first)


class SparkUnavailable(RetryableError):
    """No Spark session could be started, or the Spark job failed for a reason outside the task code
    (executors lost, worker processes killed, the job cancelled)."""


# --- fatal -----------------------------------------------------------------------------------


class LedgerLost(FatalError):
    """The table says this pipeline committed before, but no snapshot carries its ledger."""

    def __init__(self, pipeline: str, table: str, registry_property: str, offsets_key: str) -> None:
        self.pipeline, self.table = pipeline, table
        super().__init__(
            f"ledger lost: table {table} lists pipeline {pipeline!r} in its '{registry_property}' property, but no "
            f"snapshot in the current branch's ancestry carries '{offsets_key}' (expired, rolled back "
            "or rewritten by another tool). Refusing to guess where to resume. Fix: "
            '`ingest reset -c <config> --from-table --reason "..."` rebuilds the ledger exactly from the Kafka '
            "coordinates stored in the table and its dead letters (or roll the table back to a snapshot that "
            "still carries the ledger)."
        )


class DataLoss(FatalError):
    """Records the pipeline has not read were deleted (retention) before it read them."""

    def __init__(self, topic: str, partition: int, start: int, low: int) -> None:
        self.topic, self.partition, self.start, self.low = topic, partition, start, low
        super().__init__(
            f"data loss on {topic}[{partition}]: the ledger resumes at offset {start} but the earliest "
            f"retained offset is {low}; offsets [{start}, {low}) were deleted before they were ingested. "
            "Nothing was written. Re-ingest them from another source, or set `on_data_loss: skip` to record "
            "the lost range in the snapshot summary and continue."
        )


class TopicRecreated(FatalError):
    """The topic or cluster is not the one the ledger was written against."""


class TopicIdChanged(TopicRecreated):
    """Kafka has other topic ids than the ledger recorded under these names: the topics were deleted
    and created again. ``changed``: (topic, id in the ledger, id in Kafka) each; ``earliest``:
    (topic, partition, offset) of the new topics' earliest offsets, for the reset that goes on."""

    def __init__(
        self,
        changed: Sequence[tuple[str, str, str]],
        earliest: Sequence[tuple[str, int, int]],
        table: str | None = None,
    ) -> None:
        self.changed, self.earliest, self.table = tuple(changed), tuple(earliest), table
        names = ", ".join(repr(topic) for topic, _, _ in self.changed)
        ids = "; ".join(f"{topic!r}: the ledger has {was}, Kafka has {now}" for topic, was, now in self.changed)
        offsets = ",".join(f"{topic}:{partition}={offset}" for topic, partition, offset in self.earliest)
        where = f" --table {table}" if table else ""
        reason = "recreated " + " ".join(topic for topic, _, _ in self.changed)
        noun, verb = ("topic", "was") if len(self.changed) == 1 else ("topics", "were")
        super().__init__(
            f"{noun} {names} {verb} deleted and recreated under the same name, so the ledger's offsets belong "
            f"to another topic ({ids}). Nothing was read or committed. To read the new {noun} from the earliest "
            f'offsets: ingest reset -c <config>{where} --to-offsets {offsets} --reason "{reason}" (or name the '
            "offsets to resume at)."
        )

    def on_table(self, table: str) -> TopicIdChanged:
        """The same error, its reset command naming ``--table`` (a config of several tables)."""
        return TopicIdChanged(self.changed, self.earliest, table)


class TopicMoved(FatalError):
    """A topic new to a table was read into another table of the same pipeline: reading it again
    from the start would store its records twice."""


class TopicNotFound(FatalError):
    """A configured topic does not exist."""


class TableMismatch(FatalError):
    """An existing table does not fit the configured schema."""


class SchemaChangeRefused(FatalError):
    """Records were written with a schema the table cannot (or, by ``on_schema_change: fail``, may
    not) evolve to; nothing of the batch was committed."""


class TooManyDeadLetters(FatalError):
    """A batch's share of dead letters is over ``dead_letters.max_ratio``; nothing was committed."""


class KeyInTwoTasks(FatalError):
    """A changelog batch changed a key in two partitions that two tasks read: neither knows the
    order of the other's change, so the batch cannot be folded; nothing was committed."""


class VerificationFailed(FatalError):
    """``ingest verify`` found offsets missing or duplicated."""


class LedgerFormatError(FatalError):
    """A summary carries this pipeline's keys in a form this version cannot read."""


class WrittenFilesGone(FatalError):
    """Data files a committed snapshot says are still to be added elsewhere (a batch's dead
    letters) are no longer in storage: deleted by hand, or by an orphan-file removal of another tool."""


class ReplayImpossible(FatalError):
    """Kafka no longer holds records the replay would need, or the table no longer holds S."""


class RollbackRefused(FatalError):
    """Rolling main back to S would lose another pipeline's ledger."""


class PublishRefused(FatalError):
    """Main holds commits since the fork that publishing would drop and cannot carry over."""


class KafkaRefused(ConfigError):
    """Kafka turned this client away: a failed SASL login, a TLS certificate it cannot verify, or no
    permission on a topic. Retrying with the same configuration cannot help."""


class RecordTooLarge(ConfigError):
    """A record batch in a planned range is larger than the consumer may receive
    (``receive.message.max.bytes``): no retry can read it, raising the limit can."""

    def __init__(self, topic: str, partition: int, offset: int, size: int, limit: int) -> None:
        self.topic, self.partition, self.offset, self.size, self.limit = topic, partition, offset, size, limit
        super().__init__(
            f"kafka.receive.message.max.bytes: the record batch at offset {offset} of {topic}[{partition}] comes "
            f"in a response of {size:,} bytes, over the consumer's receive.message.max.bytes ({limit:,}), so it "
            f"cannot be read. Raise receive.message.max.bytes in `kafka:` to at least {size + 512:,} (or leave "
            "it out: librdkafka's default is 100,000,000) and run again; `ingest check` compares it with what "
            "the topics accept. Nothing was committed; the records stay in Kafka."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.topic, self.partition, self.offset, self.size, self.limit))


class RegistryRefused(ConfigError):
    """The Schema Registry turned this client away (401/403), or a configured subject does not exist."""


class SubjectNotFound(RegistryRefused):
    """The Schema Registry has no subject the pipeline derives a schema from."""
