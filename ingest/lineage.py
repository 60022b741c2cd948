"""OpenLineage run events of a pipeline's runs, with the official ``openlineage-python`` client.

Each table's run (a catch-up: ``ingest run``, a tick of ``--every``, an Airflow task) is an
OpenLineage run of the job ``<pipeline>`` (``<pipeline>.<table>`` for a table of ``tables:``):
START when its batches begin, COMPLETE when they end well, FAIL with the error when they do not.

* **Inputs** are the Kafka topics, named as OpenLineage's naming spec says for Kafka: namespace
  ``kafka://<first bootstrap server host>:<port>``, name the topic.
* **Outputs** are the rows table and the dead-letter table, named by their location as the spec
  names files and as OpenLineage's Spark integration names Iceberg tables (``s3://bucket`` and the
  path; ``file`` and the path), with the ``symlinks`` facet naming the table in its catalog
  (``iceberg://<catalog name>``, ``namespace.table``), the ``catalog`` facet, the ``schema`` facet,
  and on COMPLETE ``version`` (the newest snapshot the run committed) and ``outputStatistics``.
* **Our facet** ``lakehouseIngest`` (a run facet, schema in ``docs/openlineage/``): each batch of
  the run, its status, snapshot id and offset ranges: the ledger the snapshots carry, so lineage
  links to the exact snapshot.

Where events go is openlineage-python's standard configuration (``OPENLINEAGE_URL``,
``openlineage.yml``, ``OPENLINEAGE__*``), or the config's ``lineage:`` block; with none, no event
is sent. A backend that is down never fails a run: the error is logged and counted.

openlineage-python is imported only here, and only by a run with a destination (its import
takes ~0.2 s): whether there is one is :func:`ingest.config.lineage_spec.configured`'s.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any
from urllib.parse import urlparse

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    RunFacet,
    catalog_dataset,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    output_statistics_output_dataset,
    processing_engine_run,
    schema_dataset,
    symlinks_dataset,
)
from openlineage.client.uuid import generate_new_uuid

from ingest.batch_result import BatchResult
from ingest.config import PipelineConfig
from ingest.config.lineage_spec import LineageSpec, configured
from ingest.ports import TableShape

log = logging.getLogger(__name__)

PRODUCER = "https://github.com/lakehouse-ingest/lakehouse-ingest"
#: the JSON Schema of :class:`LakehouseIngestRunFacet` (``docs/openlineage/LakehouseIngestRunFacet.json``)
FACET_SCHEMA = f"{PRODUCER}/blob/main/docs/openlineage/LakehouseIngestRunFacet.json"


@attr.define
class LakehouseIngestRunFacet(RunFacet):
    """The batches of a run: each one's status, snapshot and offset ranges (the ledger)."""

    pipeline: str
    table: str
    batches: list[dict[str, Any]]

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA


def client_of(spec: LineageSpec | None) -> OpenLineageClient:
    """The client for ``spec``, else the standard configuration's."""
    if spec is None:
        return OpenLineageClient()
    transport = spec.transport
    if transport is None:
        transport = {"type": "http", "url": spec.url, "endpoint": spec.endpoint, "timeout": spec.timeout_s}
        transport["retry"] = {"total": 1, "connect": 1, "read": 1, "backoff_factor": 0.2}
        if spec.api_key:
            transport["auth"] = {"type": "api_key", "apiKey": spec.api_key}
    return OpenLineageClient(config={"transport": transport})


def job_name(config: PipelineConfig) -> str:
    """``<pipeline>``, or ``<pipeline>.<table>`` for a table of ``tables:``."""
    return f"{config.pipeline}.{config.table}" if config.siblings else config.pipeline


def kafka_namespace(config: PipelineConfig) -> str:
    """``kafka://host:port`` of the first bootstrap server (OpenLineage's naming spec for Kafka)."""
    first = str(config.kafka.get("bootstrap.servers", "")).split(",")[0].strip()
    host = first.rpartition("://")[2] or "localhost"
    return f"kafka://{host if ':' in host else f'{host}:9092'}"


def location_naming(location: str) -> tuple[str, str]:
    """A table location as OpenLineage names files: ``(namespace, name)``."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return "file", parsed.path or location
    if parsed.scheme in ("s3", "s3a", "s3n", "gs", "gcs"):
        scheme = "s3" if parsed.scheme.startswith("s3") else "gs"
        return f"{scheme}://{parsed.netloc}", parsed.path.lstrip("/")
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path


@dataclass(frozen=True)
class Datasets:
    """A run's inputs and outputs, as events and Airflow's provider carry them."""

    inputs: list[InputDataset]
    outputs: list[OutputDataset]
    run_facets: dict[str, RunFacet]


def datasets(
    config: PipelineConfig,
    rows: TableShape,
    dead: TableShape | None,
    results: Sequence[BatchResult] = (),
) -> Datasets:
    """``config``'s topics in, its tables out; with ``results`` (the run's batches), what they committed."""
    namespace = kafka_namespace(config)
    topics = dict.fromkeys([*config.topics, *(topic for r in results for topic, _, _, _ in r.ranges)])
    inputs = [InputDataset(namespace, topic) for topic in topics]
    landed = [r for r in results if r.status in ("committed", "landed")]
    newest = next((r.snapshot_id for r in reversed(landed) if r.snapshot_id is not None), None)
    outputs = [_output(config, rows, landed, sum(r.records for r in landed), newest)]
    if dead is not None:  # its snapshots are its own: the newest is its head as the run left it
        dead_landed = [r for r in landed if r.dead_letters]
        version = dead.snapshot_id if dead_landed else None
        outputs.append(_output(config, dead, dead_landed, sum(r.dead_letters for r in landed), version))
    batches = [
        {
            "batch": r.batch,
            "status": r.status,
            "snapshotId": r.snapshot_id,
            "records": r.records,
            "deadLetters": r.dead_letters,
            "ranges": [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in r.ranges],
        }
        for r in landed
    ]
    facets: dict[str, RunFacet] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=metadata.version("lakehouse-ingest"),
            name="lakehouse-ingest",
            openlineageAdapterVersion=metadata.version("openlineage-python"),
        ),
    }
    if results:
        facets["lakehouseIngest"] = LakehouseIngestRunFacet(config.pipeline, config.table, batches, producer=PRODUCER)
    return Datasets(inputs, outputs, facets)


def _output(
    config: PipelineConfig, shape: TableShape, landed: Sequence[BatchResult], rows: int, version: int | None
) -> OutputDataset:
    namespace, name = location_naming(shape.location)
    catalog = config.catalog.get("name", "default")
    facets: dict[str, Any] = {
        "schema": schema_dataset.SchemaDatasetFacet(
            fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in shape.columns]
        ),
        "symlinks": symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[symlinks_dataset.Identifier(f"iceberg://{catalog}", shape.identifier, "TABLE")]
        ),
        "catalog": catalog_dataset.CatalogDatasetFacet(
            framework="iceberg", type=config.catalog.get("type", "rest"), name=catalog, source="iceberg"
        ),
    }
    if version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version))
    output_facets: dict[str, Any] = {}
    if landed:
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=rows
        )
    return OutputDataset(namespace, name, facets=facets, outputFacets=output_facets)


class RunLineage:
    """The OpenLineage events of one table's runs; ``failed`` hears of each event that could not be sent."""

    def __init__(
        self,
        config: PipelineConfig,
        shapes: Callable[[], tuple[TableShape, TableShape | None]],
        client: OpenLineageClient,
        failed: Callable[[], None] = lambda: None,
    ) -> None:
        self.config, self.shapes, self.client, self.failed = config, shapes, client, failed
        spec = config.lineage
        self.namespace = (spec.namespace if spec is not None else None) or os.environ.get(
            "OPENLINEAGE_NAMESPACE", "default"
        )
        self.run_id: str | None = None

    @classmethod
    def of(
        cls,
        config: PipelineConfig,
        shapes: Callable[[], tuple[TableShape, TableShape | None]],
        failed: Callable[[], None] = lambda: None,
    ) -> RunLineage | None:
        """The run's lineage, or None when no destination is configured (:func:`configured`)."""
        if not configured(config.lineage):
            return None
        return cls(config, shapes, client_of(config.lineage), failed)

    def started(self) -> None:
        self.run_id = str(generate_new_uuid())
        self._emit(RunState.START, ())

    def completed(self, results: Iterable[BatchResult]) -> None:
        self._emit(RunState.COMPLETE, list(results))

    def failed_with(self, error: BaseException, results: Iterable[BatchResult]) -> None:
        message = f"{type(error).__name__}: {error}"
        stack = "".join(traceback.format_exception(error))
        facet = error_message_run.ErrorMessageRunFacet(message=message, programmingLanguage="python", stackTrace=stack)
        self._emit(RunState.FAIL, list(results), {"errorMessage": facet})

    def _emit(self, state: RunState, results: Sequence[BatchResult], extra: dict[str, RunFacet] | None = None) -> None:
        if self.run_id is None:
            self.run_id = str(generate_new_uuid())
        try:
            rows, dead = self.shapes()
            found = datasets(self.config, rows, dead, results)
            job = Job(
                self.namespace,
                job_name(self.config),
                facets={
                    "jobType": job_type_job.JobTypeJobFacet(
                        processingType="BATCH", integration="LAKEHOUSE_INGEST", jobType="JOB"
                    )
                },
            )
            event = RunEvent(
                eventType=state,
                eventTime=datetime.now(UTC).isoformat(),
                run=Run(self.run_id, facets={**found.run_facets, **(extra or {})}),
                job=job,
                producer=PRODUCER,
                inputs=found.inputs,
                outputs=found.outputs,
            )
            self.client.emit(event)
        except Exception as error:  # lineage is never worth a run
            self.failed()
            log.warning("OpenLineage: could not send the %s event of %s: %s", state.value, job_name(self.config), error)
