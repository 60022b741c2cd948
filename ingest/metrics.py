"""Prometheus metrics of a pipeline's runs (``metrics:`` in the config).

A run's metrics are exported after each batch it commits, as its progress is logged while a batch
is in flight, and when it ends, whatever ends it: written atomically to a node_exporter textfile
(``textfile:``), and/or pushed to a Pushgateway (``pushgateway:``, grouped by job and pipeline,
replacing the previous run's when it ends). A long-running ``ingest run --every`` also serves them
on ``/metrics`` (``port:``). Counters count since the process started (one run, for a scheduled
one), with no ``_created`` series; the gauges say where the pipeline is: when a run last succeeded
and failed, how fresh the data is, the lag of each partition (while a catch-up runs, to the end
offsets it aims at), and how far the batch in flight is.

A failed run must not erase when the last one succeeded (the alert that matters). So the textfile's
previous ``last_success``, ``last_failure`` and ``valid_through`` are read back when a run starts,
and on a Pushgateway each outcome's timestamp is a group of its own (``outcome="success"`` or
``"failure"`` beside the pipeline) that only a run of that outcome replaces.

prometheus_client is imported only here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    push_to_gateway,
    pushadd_to_gateway,
    start_http_server,
)
from prometheus_client import write_to_textfile as write_textfile
from prometheus_client.parser import text_string_to_metric_families

from ingest.core.ledger import TopicPartition
from ingest.progress import Figures

log = logging.getLogger(__name__)

# a counter's `_created` series says when this process made it: noise for a scheduled run's metrics
disable_created_metrics()  # type: ignore[no-untyped-call]


class Exports(Protocol):
    """Where a run's metrics go (``metrics:``, :class:`ingest.config.MetricsSpec`)."""

    @property
    def textfile(self) -> str | None:
        """A node_exporter textfile collector file, written atomically."""
        ...

    @property
    def pushgateway(self) -> str | None:
        """A Pushgateway URL, pushed under :attr:`job` and the pipeline (and the table, :attr:`per_table`)."""
        ...

    @property
    def job(self) -> str: ...

    @property
    def port(self) -> int | None:
        """``ingest run --every``: ``/metrics`` served on this port while running."""
        ...

    @property
    def per_table(self) -> bool:
        """One of the tables of ``tables:``: a textfile and a Pushgateway group of its own."""
        ...


class RunMetrics:
    """The metrics of one pipeline's runs in this process, and where they are exported."""

    def __init__(self, spec: Exports, pipeline: str, table: str) -> None:
        self.spec = spec
        self.labels = {"pipeline": pipeline, "table": table}
        self.registry = registry = CollectorRegistry()
        names = list(self.labels)
        self.batches = Counter("ingest_batches", "Batches run, by outcome", [*names, "status"], registry=registry)
        self.records = Counter("ingest_records", "Records committed to the table", names, registry=registry)
        self.dead_letters = Counter(
            "ingest_dead_letters", "Records committed to the dead-letter table", names, registry=registry
        )
        self.bytes = Counter(
            "ingest_bytes", "Bytes of Kafka values read by committed batches", names, registry=registry
        )
        self.unknown = Counter(
            "ingest_unknown_fields_records",
            "Records with JSON fields the table does not declare",
            names,
            registry=registry,
        )
        self.retries = Counter(
            "ingest_commit_retries",
            "Commit attempts that had to observe again, by why: conflict (another writer committed first), "
            "unknown (the outcome was open: a timeout, a lost acknowledgement), fenced (the batch was planned again)",
            [*names, "reason"],
            registry=registry,
        )
        self.seconds = Histogram(
            "ingest_batch_duration_seconds",
            "Wall time of a batch: plan, read, decode, write, commit",
            names,
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.succeeded = Gauge(
            "ingest_last_success_timestamp_seconds",
            "When a run of the pipeline last ended well",
            names,
            registry=registry,
        )
        self.failed = Gauge(
            "ingest_last_failure_timestamp_seconds", "When a run of the pipeline last failed", names, registry=registry
        )
        self.valid_through = Gauge(
            "ingest_valid_through_timestamp_seconds",
            "The table is complete through this time (min over partitions of the newest committed record's"
            " timestamp or, if later, when a batch last read the partition to its end)",
            names,
            registry=registry,
        )
        self.lag = Gauge(
            "ingest_lag_records", "Records in Kafka past the ledger", [*names, "topic", "partition"], registry=registry
        )
        self.lineage_failures = Counter(
            "ingest_lineage_failures",
            "OpenLineage events that could not be sent (the backend down or refusing them); the runs went on",
            names,
            registry=registry,
        )
        self.planned = Gauge(
            "ingest_batch_planned_records",
            "Records the batch in flight reads (0 between batches)",
            names,
            registry=registry,
        )
        self.read = Gauge(
            "ingest_batch_read_records",
            "Records the batch in flight has read and decoded so far (0 between batches)",
            names,
            registry=registry,
        )
        self.eta = Gauge(
            "ingest_catch_up_eta_seconds",
            "Seconds until the catch-up in progress reaches the end offsets it aims at, at its rate so far",
            names,
            registry=registry,
        )
        self._outcomes = {True: self._outcome(self.succeeded), False: self._outcome(self.failed)}
        if spec.textfile is not None:
            self._read_back(spec.textfile)

    def _outcome(self, like: Gauge) -> tuple[CollectorRegistry, Gauge]:
        """A registry of its own for one outcome's timestamp (its own Pushgateway group)."""
        registry = CollectorRegistry()
        return registry, Gauge(like._name, like._documentation, list(self.labels), registry=registry)

    def _read_back(self, path: str) -> None:
        """The previous run's gauges of this pipeline from its textfile, so a run that exports
        without having set them (a failure does not set ``last_success``) keeps them."""
        try:
            with open(path) as previous:
                families = list(text_string_to_metric_families(previous.read()))
        except (OSError, ValueError):
            return  # none yet, or not ours to read: start afresh
        kept = {g._name: g for g in (self.succeeded, self.failed, self.valid_through)}
        for family in families:
            for sample in family.samples:
                gauge = kept.get(sample.name)
                if gauge is not None and sample.labels == self.labels:
                    gauge.labels(**self.labels).set(sample.value)
                elif sample.name == self.lag._name and {**sample.labels, **self.labels} == sample.labels:
                    self.lag.labels(**sample.labels).set(sample.value)

    def batch(
        self,
        status: str,
        records: int,
        dead_letters: int,
        nbytes: int,
        unknown: int,
        seconds: float,
        retries: Mapping[str, int] | None = None,
    ) -> None:
        self.batches.labels(**self.labels, status=status).inc()
        for reason, count in (retries or {}).items():
            self.retries.labels(**self.labels, reason=reason).inc(count)
        if status not in ("committed", "landed"):
            return
        self.records.labels(**self.labels).inc(records)
        self.dead_letters.labels(**self.labels).inc(dead_letters)
        self.bytes.labels(**self.labels).inc(nbytes)
        self.unknown.labels(**self.labels).inc(unknown)
        self.seconds.labels(**self.labels).observe(seconds)

    def lineage_failed(self) -> None:
        self.lineage_failures.labels(**self.labels).inc()

    def progressed(self, figures: Figures, lag: Mapping[TopicPartition, int] | None) -> None:
        """How far the run is (after a batch, and while one is in flight): the gauges set, exported."""
        self.planned.labels(**self.labels).set(figures.batch_planned)
        self.read.labels(**self.labels).set(figures.batch_done)
        if figures.eta_s is not None:
            self.eta.labels(**self.labels).set(figures.eta_s)
        self._lag(lag)
        self.export(None)

    def _lag(self, lag: Mapping[TopicPartition, int] | None) -> None:
        for tp, behind in (lag or {}).items():
            self.lag.labels(**self.labels, topic=tp.topic, partition=str(tp.partition)).set(behind)

    def ended(self, ok: bool, lag: Mapping[TopicPartition, int] | None, valid_through_ms: int | None) -> None:
        """A run ended (``ok`` or not): the gauges set, and the metrics exported. ``lag`` is None when
        Kafka or the table could not say (the run's failure, most likely): the last values stay."""
        now = time.time()
        (self.succeeded if ok else self.failed).labels(**self.labels).set(now)
        self._outcomes[ok][1].labels(**self.labels).set(now)
        self.planned.labels(**self.labels).set(0)
        self.read.labels(**self.labels).set(0)
        self._lag(lag)
        if valid_through_ms is not None:
            self.valid_through.labels(**self.labels).set(valid_through_ms / 1000)
        self.export(ok)

    def export(self, ok: bool | None) -> None:
        """Write the textfile and push to the Pushgateway, as configured, for a run that ended
        (``ok`` or not) or is still going (None). A failure to export is logged, never raised: the
        run's own outcome (and exit code) is what counts."""
        if self.spec.textfile is not None:
            try:
                write_textfile(self.spec.textfile, self.registry)  # a temporary file renamed over it
            except OSError as error:
                log.warning("metrics: cannot write %s: %s", self.spec.textfile, error)
        if self.spec.pushgateway is not None:
            group = {"pipeline": self.labels["pipeline"]}
            if self.spec.per_table:  # one of the tables of `tables:`: each its own group
                group["table"] = self.labels["table"]
            # a run that ended well replaces its group; a failed one, or one still going, only the
            # metrics it has values for, so the freshness and lag the last good run pushed stay when a
            # failure cannot tell
            run_push = push_to_gateway if ok else pushadd_to_gateway
            pushes = [(run_push, group, self._run_only())]
            if ok is not None:
                outcome = {**group, "outcome": "success" if ok else "failure"}
                pushes.append((push_to_gateway, outcome, self._outcomes[ok][0]))
            for push, grouping, registry in pushes:
                try:
                    push(self.spec.pushgateway, job=self.spec.job, grouping_key=grouping, registry=registry, timeout=10)
                except OSError as error:
                    log.warning("metrics: cannot push to %s: %s", self.spec.pushgateway, error)

    def _run_only(self) -> CollectorRegistry:
        """The registry of the run's metrics that have values, without the outcome timestamps (their
        groups are their own on a Pushgateway)."""
        registry = CollectorRegistry()
        collectors = (
            self.batches,
            self.records,
            self.dead_letters,
            self.bytes,
            self.unknown,
            self.seconds,
            self.lineage_failures,
        )
        for collector in (*collectors, self.valid_through, self.lag, self.planned, self.read, self.eta):
            if any(family.samples for family in collector.collect()):
                registry.register(collector)
        return registry

    def serve(self) -> Any:
        """Serve ``/metrics`` on ``port`` (``run --every``) from a daemon thread; the server."""
        assert self.spec.port is not None
        server, _ = start_http_server(self.spec.port, registry=self.registry)
        return server
