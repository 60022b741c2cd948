"""The Python API: each ``ingest`` command as a function of a config that returns a typed result.

The ``ingest`` command line is a thin layer over these (it parses options, renders the result for
people or as ``--json``, and turns errors into exit codes):

    from ingest import api

    config = api.load("conf/orders.yaml")          # or api.parse({...}) for a config built in code
    print(api.check(config).ok)                    # what a run would meet; changes nothing
    for result in api.run("conf/shop.yaml", until_caught_up=True):   # every table of the file
        print(result.batch, result.status, result.records, result.snapshot_id)
    api.verify("conf/shop.yaml", table="shop.payments")   # one table of several
    with api.open_run(config) as run:              # or hold a run open: its tables and engine
        print(run.batch().status)
    status = api.status(config)                    # lag per partition, dead letters
    assert api.verify(config).ok                   # every offset in the table or dead letters once

Every function takes a :class:`~ingest.config.PipelineConfig` or the path of a YAML file; of a
file with ``tables:``, ``table=`` names the table (``tables(path)`` gives each one's config), and
``run`` runs them all unless told one.

* **Results** are frozen dataclasses: :class:`~ingest.batch_result.BatchResult`,
  :class:`~ingest.ops.report.Status`, :class:`~ingest.ops.report.BatchEntry`,
  :class:`~ingest.ops.verify.Verification`, :class:`~ingest.ops.check.CheckResult`,
  :class:`~ingest.ops.reset_command.ResetResult`, :class:`~ingest.ops.redrive.Redrive`,
  :class:`~ingest.ops.maintain.Maintenance`, :class:`~ingest.ops.replay_result.ReplayResult`,
  :class:`~ingest.ops.partitioning.Repartitioned`; each
  ``as_dict()`` is what ``--json`` prints.
* **Errors** are the classes of :mod:`ingest.errors`: a :class:`~ingest.errors.RetryableError`
  heals by itself (retry later; the protocol makes it safe), a
  :class:`~ingest.errors.FatalError` needs a person, a :class:`~ingest.errors.ConfigError` names
  the key to fix; each has the ``exit_code`` the command exits with.
* **Read-only** functions (``check``, ``status``, ``history``, ``verify``, ``redrive`` with
  ``dry_run``) create and change nothing: before the first run they say so in their result.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.config import PipelineConfig, load_routes, parse
from ingest.config.loading import chosen
from ingest.errors import ConfigError

if TYPE_CHECKING:
    from ingest.assembly import Opened
    from ingest.batch_result import BatchResult
    from ingest.ops.check import CheckResult
    from ingest.ops.maintain import Maintenance
    from ingest.ops.partitioning import Repartitioned
    from ingest.ops.redrive import Redrive
    from ingest.ops.replay_result import ReplayResult
    from ingest.ops.report import BatchEntry, Status
    from ingest.ops.reset_command import ResetResult, ResetTarget
    from ingest.ops.verify import Verification
    from ingest.runner import EngineChoice, Run

__all__ = [
    "check",
    "evolve_partitioning",
    "history",
    "load",
    "maintain",
    "open_run",
    "parse",
    "redrive",
    "replay",
    "reset",
    "run",
    "status",
    "tables",
    "verify",
]

Config = PipelineConfig | str | Path
#: how the API names one table of several (where the command line says ``--table``)
BY_ARGUMENT = "table= (api.run takes them all without it; api.tables(path) gives each one's config)"


def load(path: str | Path, table: str | None = None) -> PipelineConfig:
    """The config of the file at ``path``: its only table's, or (``tables:``) that of ``table``."""
    return chosen(load_routes(path), str(path), table, BY_ARGUMENT)


def tables(path: str | Path) -> list[PipelineConfig]:
    """The config of each table of the file at ``path`` (one, or one per entry of ``tables:``)."""
    return load_routes(path)


def _config(config: Config, table: str | None = None) -> PipelineConfig:
    if not isinstance(config, PipelineConfig):
        return load(config, table)
    if table is not None and table != config.table:
        raise ConfigError(f"the config given is that of table {config.table!r}, not {table!r}")
    return config


def _existing(config: PipelineConfig) -> Opened | None:
    """The pipeline if its rows table exists (opened), else None: nothing is created."""
    from ingest.assembly import open_existing

    return open_existing(config)


def _opened(config: PipelineConfig) -> Opened:
    """The pipeline, its tables created if missing."""
    from ingest.assembly import open_pipeline

    return open_pipeline(config)


@contextmanager
def open_run(
    config: Config,
    engine: EngineChoice = "local",
    *,
    table: str | None = None,
    spark: Any = None,
    early_workers: bool = True,
) -> Iterator[Run]:
    """A run of ``config``: its tables (created if missing) and an engine (``"local"``: this
    machine's cores; ``"spark"``: the active Spark session, or ``spark``), kept for every batch
    until the block ends. ``run.batch()`` commits one batch; ``run.batches(until_caught_up=True,
    max_batches=None)`` yields each batch's :class:`~ingest.batch_result.BatchResult`."""
    from ingest.runner import opened

    with opened(_config(config, table), engine, spark=spark, early_workers=early_workers) as run:
        yield run


def run(
    config: Config | list[PipelineConfig],
    *,
    table: str | None = None,
    until_caught_up: bool = False,
    max_batches: int | None = None,
    engine: EngineChoice = "local",
) -> list[BatchResult]:
    """What ``ingest run`` does, as a function: one batch of each table of ``config`` (a YAML file
    may name several: ``tables:``; ``table`` runs one of them), or batches until each is caught up;
    the results in order. A table that fails does not hold the others back; the first fatal
    failure is raised once every table had its turn, else the first."""
    from ingest.driver import Collected, Schedule, drive

    if isinstance(config, list):
        configs = config
    elif table is not None or isinstance(config, PipelineConfig):
        configs = [_config(config, table)]
    else:
        configs = load_routes(config)
    collected = Collected()
    drive(configs, collected, Schedule(until_caught_up, max_batches), engine)
    return collected.results


@contextmanager
def spark_session() -> Iterator[Any]:
    """A Spark session for several runs on ``engine="spark"`` (pass it as ``open_run(..., spark=)``):
    the active session, or one built from the usual settings and stopped when the block ends."""
    from ingest.engines.spark import shared_session  # ConfigError naming the extra when pyspark is missing

    with shared_session() as spark:
        yield spark


def check(config: Config, *, table: str | None = None) -> CheckResult:
    """What a run of ``config`` would meet (Kafka, the registry, the catalog, the tables), changing nothing."""
    from ingest.ops.check import check as checked

    return checked(_config(config, table))


def status(config: Config, *, table: str | None = None) -> Status:
    """Per partition: the committed offset, the end offset and the lag; the dead letters."""
    from ingest.kafka.source import KafkaSource
    from ingest.ops import report

    loaded = _config(config, table)
    pipeline = _existing(loaded)
    if pipeline is not None:
        return report.status(pipeline)
    source = KafkaSource(loaded.kafka, loaded.subscription, loaded.group_id, loaded.batch.read_timeout_s)
    return report.status_before_tables(loaded, source)


def history(config: Config, limit: int | None = 50, *, table: str | None = None) -> list[BatchEntry]:
    """The pipeline's batches and resets, newest first (at most ``limit``)."""
    from ingest.ops import report

    pipeline = _existing(_config(config, table))
    return report.history(pipeline, limit=limit) if pipeline is not None else []


def verify(config: Config, *, table: str | None = None) -> Verification:
    """Whether every offset of the ledger's ranges Kafka still holds is in the table or the dead
    letters as many times as the ledger read it (``.ok``), per partition, with what is not."""
    from ingest.ops import verify as verifying

    loaded = _config(config, table)
    pipeline = _existing(loaded)
    return verifying.verify(pipeline) if pipeline is not None else verifying.nothing_to_verify(loaded)


def not_routed(config: PipelineConfig, command: str) -> PipelineConfig:
    """``config``, unless it routes by value (``route_by``), which ``command`` does not handle yet."""
    if config.route_by is not None:
        raise ConfigError(
            f"{command} does not handle a pipeline that routes records by value (route_by) yet: the ledger of "
            f"{config.table} and the floor of every routed table would have to move together. Nothing was changed. "
            "`ingest run`, `status`, `history`, `verify`, `check` and `maintain` handle it."
        )
    return config


def reset(
    config: Config, target: ResetTarget, reason: str, reset_id: str | None = None, *, table: str | None = None
) -> ResetResult:
    """Move the ledger to ``target`` (:class:`~ingest.ops.reset_command.ResetTarget`) in one snapshot
    without data, applied once however often the same command runs (``reset_id``: see ``ingest reset``)."""
    from ingest.ops.reset import reset as moved

    return moved(_opened(not_routed(_config(config, table), "ingest reset")), target, reason, reset_id)


def redrive(config: Config, *, dry_run: bool = False, table: str | None = None) -> Redrive:
    """Decode the dead letters again and move those that decode now to the table, exactly once."""
    from ingest.ops.redrive import Redrive
    from ingest.ops.redrive import redrive as redriven

    loaded = not_routed(_config(config, table), "ingest redrive")
    pipeline = _existing(loaded)  # no table: no dead letters, and nothing is created
    return redriven(pipeline, dry_run=dry_run) if pipeline is not None else Redrive(loaded.pipeline, dry_run)


def evolve_partitioning(config: Config, *, dry_run: bool = False, table: str | None = None) -> Repartitioned:
    """Evolve the rows table's partition spec to ``partition_by`` (one metadata commit, no
    snapshot; new data follows it); with ``dry_run``, only say how."""
    from ingest.ops.partitioning import evolve_partitioning as evolved

    return evolved(not_routed(_config(config, table), "ingest evolve-partitioning"), dry_run=dry_run)


def maintain(config: Config, *, table: str | None = None) -> Maintenance:
    """Compact small files, expire old snapshots and remove orphan files, keeping every ledger."""
    from ingest.ops.maintain import maintain as maintained

    return maintained(_opened(_config(config, table)))


def replay(
    run: Run,
    snapshot_id: int | None = None,
    as_of_ms: int | None = None,
    *,
    publish: bool = False,
    rollback: bool = False,
) -> ReplayResult:
    """Re-ingest everything after snapshot ``snapshot_id`` (or main as of ``as_of_ms``) with the
    engine of ``run`` (:func:`open_run`): into a branch, published onto main with ``publish``, or
    by rolling main back with ``rollback``."""
    from ingest.ops.replay import replay as replayed

    not_routed(run.pipeline.config, "ingest replay")
    return replayed(run, snapshot_id, as_of_ms, publish=publish, rollback=rollback)
