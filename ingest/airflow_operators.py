"""Apache Airflow 3 operators: run a pipeline's batches in the worker, check freshness, or
spark-submit the Spark job. :mod:`ingest.airflow` makes a DAG of them per config, and is where
they are imported from.

Failures are explicit, in the terms of :mod:`ingest.errors`:

* a retryable error (broker or catalog unavailable, fenced by an overlapping run, a commit that
  did not settle) is raised as it is, so Airflow retries it with the task's back-off;
* a fatal error (data loss, ledger lost, recreated topic, bad config) and an internal error (a bug)
  raise ``AirflowFailException``: the task fails at once, without retries, the message in its log.

Retrying is safe by construction: a batch lands with its ledger in one snapshot or leaves no
trace, so a retry, a killed task or a second run racing the first never duplicates a record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

try:
    from airflow.sdk import Asset, AssetAlias, BaseOperator, RetryDecision, RetryPolicy
    from airflow.sdk.exceptions import AirflowFailException
except ImportError as error:
    raise ImportError(
        "the Airflow integration needs Apache Airflow 3.3 or later: pip install 'lakehouse-ingest[airflow]'"
    ) from error

from ingest import config as config_module
from ingest.errors import ExitCode, IngestError

#: exit code of a command-line usage error (click), from the Spark job's CLI
USAGE_ERROR = 2


@contextmanager
def _explicit_failures(task: BaseOperator) -> Iterator[None]:
    """Let retryable errors through for Airflow to retry; turn everything else into a failure without retry."""
    log = task.log
    try:
        yield
    except IngestError as error:
        if error.retryable:
            log.warning("retryable %s (Airflow retries the task): %s", type(error).__name__, error)
            raise
        log.error("fatal %s (not retried): %s", type(error).__name__, error)
        raise AirflowFailException(f"{type(error).__name__}: {error}") from error
    except Exception as error:
        log.exception("internal error (a bug; not retried)")
        raise AirflowFailException(f"internal error (a bug, please report it): {error!r}") from error


def asset_alias(config_path: str | Path) -> AssetAlias:
    """The asset alias an :class:`IngestOperator` of ``config_path`` emits its table's events through."""
    return AssetAlias(f"ingest_{Path(config_path).stem}")


def table_asset(config: config_module.PipelineConfig) -> Asset:
    """The pipeline's Iceberg table as an Airflow asset: ``iceberg://<catalog>/<namespace>/<table>``,
    named by the table's identifier. A DAG scheduled on it runs after each ingest run that landed rows."""
    return Asset(uri=f"iceberg://{config.catalog['name']}/{config.table.replace('.', '/')}", name=config.table)


class IngestOperator(BaseOperator):
    """Run batches of one pipeline config in the worker (by default until caught up).

    Returns (as XCom) the totals of the run: ``pipeline``, ``batches``, ``committed``,
    ``records``, ``dead_letters`` and the last ``batch`` and ``snapshot_id``.

    Its outlet is the asset alias ``ingest_<config file stem>`` (the DAG processor reads no more of
    a config than its ``airflow:`` block): a run that committed a batch emits, through it, an event of the table's asset
    (:func:`table_asset`) whose ``extra`` holds the totals, so lineage views and DAGs scheduled on
    the table see it. A run that committed nothing emits nothing.
    """

    template_fields: Sequence[str] = ("config_path",)
    ui_color = "#cfe8fc"

    def __init__(
        self, *, config_path: str | Path, until_caught_up: bool = True, max_batches: int | None = None, **kwargs: Any
    ) -> None:
        self.alias = asset_alias(config_path)
        kwargs.setdefault("outlets", [self.alias])
        super().__init__(**kwargs)
        self.config_path = str(config_path)
        self.until_caught_up = until_caught_up
        self.max_batches = max_batches

    def execute(self, context: Any) -> dict[str, Any]:
        from ingest.driver import Schedule, drive

        with _explicit_failures(self):
            routes = config_module.load_routes(self.config_path)
            logged = _Logged(self, per_table=len(routes) > 1)
            self._seen = logged.seen
            # with Airflow's OpenLineage provider sending the task's events, the run sends none of
            # its own: the provider's carry get_openlineage_facets_on_complete's datasets
            drive(routes, logged, Schedule(self.until_caught_up, self.max_batches), lineage=not _provider_sends())
        if self.alias in self.outlets:
            for config in logged.landed:
                extra = logged.totals["tables"][config.table] if "tables" in logged.totals else logged.totals
                context["outlet_events"][self.alias].add(table_asset(config), extra=extra)
        return logged.totals

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The task's lineage for Airflow's OpenLineage provider: the Kafka topics read, the tables
        written (with their schemas and the newest snapshot committed), and the batches' ledger
        (``lakehouseIngest``), as ``ingest run`` sends them itself (:mod:`ingest.lineage`)."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from ingest.lineage import datasets

        found = [datasets(config, rows, dead, results) for config, rows, dead, results in getattr(self, "_seen", [])]
        run_facets: dict[str, Any] = {}
        for each in found:
            run_facets |= each.run_facets
        return OperatorLineage(
            inputs=[d for each in found for d in each.inputs],
            outputs=[d for each in found for d in each.outputs],
            run_facets=run_facets,
        )


def _provider_sends() -> bool:
    """Whether Airflow's OpenLineage provider is installed and configured to send events."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


class _Logged:
    """What :class:`IngestOperator` keeps of a run (a :class:`ingest.driver.Watcher`): each batch
    in the task's log, the totals it returns (per table too, for a config of several), and the
    tables a batch of the run is in (committed, or landed with its acknowledgement lost)."""

    def __init__(self, task: BaseOperator, *, per_table: bool) -> None:
        self.task, self.per_table = task, per_table
        self.totals: dict[str, Any] = {"batches": 0, "committed": 0, "records": 0, "dead_letters": 0}
        self.landed: list[config_module.PipelineConfig] = []
        #: each table's config, its tables' shapes and the run's batches, for the task's lineage
        self.seen: list[tuple[config_module.PipelineConfig, Any, Any, list[Any]]] = []
        self._table: dict[str, Any] = {}
        self._results: list[Any] = []

    @contextmanager
    def tick(self, run: Any) -> Iterator[None]:
        config = run.pipeline.config
        self.totals |= {"pipeline": config.pipeline, "batch": None, "snapshot_id": None}
        self._table = {"batches": 0, "committed": 0, "records": 0, "dead_letters": 0}
        if self.per_table:
            self.totals.setdefault("tables", {})[config.table] = self._table
        self._results = []
        try:
            yield
        finally:
            self.seen.append((config, run.pipeline.rows.shape(), run.pipeline.dead.shape(), self._results))

    def batch(self, run: Any, result: Any) -> None:
        config = run.pipeline.config
        self.task.log.info(
            "%s batch %d: %s, %d rows, %d dead letters in %.2fs (snapshot %s)",
            config.table,
            result.batch,
            result.status,
            result.records,
            result.dead_letters,
            result.seconds,
            result.snapshot_id,
        )
        _add(self.totals, result)
        _add(self._table, result)
        self._results.append(result)
        if result.status in ("committed", "landed") and config not in self.landed:
            self.landed.append(config)

    def progress(self, run: Any, figures: Any) -> None:
        self.task.log.info("progress: %s", figures.text(), extra={"progress": figures.as_dict()})

    def failed(self, config: config_module.PipelineConfig, error: Exception) -> None:
        self.task.log.error("%s: %s: %s", config.table, type(error).__name__, error)

    def retrying(self, why: str, every_s: float) -> None:
        raise AssertionError("an Airflow task runs once: Airflow retries it")


def _add(totals: dict[str, Any], result: Any) -> None:
    totals["batches"] += 1
    totals["committed"] += result.status == "committed"
    totals["records"] += result.records
    totals["dead_letters"] += result.dead_letters
    totals["batch"], totals["snapshot_id"] = result.batch, result.snapshot_id


def data_age(valid_through_ms: int | None, now: datetime) -> timedelta | None:
    """How old a pipeline's committed data is, from the ledger's valid-through (None: nothing committed)."""
    if valid_through_ms is None:
        return None
    return now - datetime.fromtimestamp(valid_through_ms / 1000, tz=UTC)


class FreshnessCheckOperator(BaseOperator):
    """Fail when the table's committed data is older than ``max_staleness``, to alert on a stalled pipeline.

    The age is measured from the ledger's valid-through: the minimum over partitions of the time each
    is complete through (its newest committed record's timestamp, or when a batch last read all
    Kafka held of it). A partition without new records does not hold it back while batches commit;
    a run with nothing new in any partition commits nothing, so pick a bound above the longest time
    the whole topic goes without a record. A stale table fails the task without retries
    (retrying a check at once does not make data fresher; the next DAG run checks again); a
    catalog that cannot be reached is retryable as usual.
    """

    template_fields: Sequence[str] = ("config_path",)
    ui_color = "#fcf3cf"

    def __init__(self, *, config_path: str | Path, max_staleness: timedelta, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = str(config_path)
        self.max_staleness = max_staleness

    def execute(self, context: Any) -> dict[str, Any]:
        with _explicit_failures(self):
            from ingest.assembly import open_pipeline

            pipelines = [open_pipeline(config) for config in config_module.load_routes(self.config_path)]
            found = [pipeline.ledger() for pipeline in pipelines]
        now = datetime.now(UTC)
        checked, stale = {}, []
        for pipeline, ledger in zip(pipelines, found, strict=True):
            age, message = self._age(pipeline.config, ledger.ledger.valid_through if ledger else None, now)
            if age is None or age > self.max_staleness:
                self.log.error("%s", message)
                stale.append(message)
            else:
                self.log.info("%s (bound %s): fresh", message, self.max_staleness)
            checked[pipeline.config.table] = age
        if stale:
            raise AirflowFailException("; ".join(stale))
        ages = [age.total_seconds() for age in checked.values() if age is not None]
        result: dict[str, Any] = {"age_s": max(ages), "max_staleness_s": self.max_staleness.total_seconds()}
        if len(checked) > 1:  # a config of several tables: the oldest is the age; each table's too
            result["tables"] = {table: age.total_seconds() for table, age in checked.items() if age is not None}
        return result

    def _age(
        self, config: config_module.PipelineConfig, valid_through_ms: int | None, now: datetime
    ) -> tuple[timedelta | None, str]:
        age = data_age(valid_through_ms, now)
        name, table = config.pipeline, config.table
        look = f"see its ingest task's log and `ingest status -c {self.config_path} --table {table}`"
        # nothing committed is stale too: a pipeline that never got a batch in is the most stalled of all
        if age is None:
            return None, f"pipeline {name!r} has committed nothing to {table} yet ({look})"
        through = (now - age).isoformat(timespec="seconds")
        message = f"pipeline {name!r}: data in {table} is complete through {through}, {_rounded(age)} ago"
        if age > self.max_staleness:
            message += (
                f", older than the bound of {self.max_staleness}: the pipeline is stalled ({look}) "
                "or no partition has had new records for that long"
            )
        return age, message


def _rounded(age: timedelta) -> timedelta:
    return timedelta(seconds=round(age.total_seconds()))


class SparkExitCodePolicy(RetryPolicy):
    """Classify a failed spark-submit by the job's exit code, like the ``ingest`` CLI's (docs/usage.md: exit codes).

    SparkSubmitOperator raises one exception type for every non-zero exit; its message carries the
    code ("Error code is: N"), which in client deploy mode is the driver's. 75 is retried; 65, 78
    and 2 (a usage error: the job's command line is wrong) fail without retry; anything else
    (spark-submit's own failures too) gets the task's default retries.
    """

    _CODE = re.compile(r"Error code is: (\d+)")

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> Any:
        match = self._CODE.search(str(exception))
        code = int(match.group(1)) if match else None
        if code == ExitCode.RETRYABLE:
            return RetryDecision.retry(reason="the Spark ingest job exited 75 (retryable)")
        if code in (ExitCode.FATAL, ExitCode.CONFIG, USAGE_ERROR):
            return RetryDecision.fail(reason=f"the Spark ingest job exited {code} (fatal: not retried)")
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {"__type": type(self).__name__}


def spark_ingest_operator(*, task_id: str, config_path: str | Path, application: str | Path, **kwargs: Any) -> Any:
    """A SparkSubmitOperator running ``jobs/spark_ingest.py -c CONFIG --until-caught-up`` (the Spark engine).

    Needs ``apache-airflow-providers-apache-spark`` (``pip install 'lakehouse-ingest[airflow-spark]'``)
    and a ``spark_default`` connection (or ``conn_id=``); other keyword arguments go to
    SparkSubmitOperator. Use client deploy mode, where spark-submit exits with the driver's exit
    code, so :class:`SparkExitCodePolicy` can tell fatal from retryable.
    """
    try:
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    except ImportError as error:
        raise ImportError(
            "the Spark path needs the Spark provider: pip install 'lakehouse-ingest[airflow-spark]'"
        ) from error
    kwargs.setdefault("retry_policy", SparkExitCodePolicy())
    kwargs.setdefault("name", f"ingest-{Path(config_path).stem}")
    return SparkSubmitOperator(
        task_id=task_id,
        application=str(application),
        application_args=["-c", str(config_path), "--until-caught-up"],
        **kwargs,
    )
