"""``ingest.api``, used as a library: typed results, the errors of ``ingest.errors``, nothing
created by the functions that only read."""

from __future__ import annotations

import pytest
import yaml

from ingest import api
from ingest.errors import ConfigError, ExitCode, FatalError, TopicNotFound
from ingest.iceberg.catalog import connect
from ingest.ops.reset_command import ResetTarget
from tests.integration.conftest import MakeEnv, Routed

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]


def test_a_pipeline_driven_from_python(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, batch={"max_records": 40})
    env.produce(100, bad_every=10)
    config = api.load(env.config_path)

    before = api.status(env.config_path)  # a path does as well as a config
    assert (before.batch, before.lag) == (None, 100) and api.history(config) == []
    note = api.verify(config).note
    assert note is not None and note.startswith("nothing committed yet")
    assert not connect(config.catalog).table_exists(config.table)  # the reads created nothing
    assert api.check(config).ok

    with api.open_run(config) as run:
        results = list(run.batches(until_caught_up=True))

    assert [r.records + r.dead_letters for r in results] == [40, 40, 20]
    assert api.status(config).lag == 0 and api.status(config).dead_letters.count == env.bad
    assert [e.batch for e in api.history(config)] == [3, 2, 1]
    assert api.verify(config).ok
    env.produce(70)  # `ingest run` as a function: one batch, or until caught up
    assert [(r.status, r.batch, r.records) for r in api.run(env.config_path)] == [("committed", 4, 40)]
    assert [(r.status, r.records) for r in api.run(config, until_caught_up=True)] == [("committed", 30)]
    assert [r.status for r in api.run(config)] == ["empty"] and api.verify(config).ok
    moved = api.reset(config, ResetTarget("earliest"), reason="read it again")
    assert moved.status == "applied" and api.reset(config, ResetTarget("earliest"), "read it again").status == (
        "already-applied"
    )


def test_errors_are_the_classes_the_exit_codes_come_from(make_env: MakeEnv) -> None:
    env = make_env()
    config = api.parse({**yaml.safe_load(env.config_path.read_text()), "topics": ["no-such-topic"]})

    with pytest.raises(TopicNotFound) as raised, api.open_run(config) as run:
        run.batch()

    assert isinstance(raised.value, FatalError) and raised.value.exit_code == ExitCode.FATAL
    assert "no-such-topic" in str(raised.value)


def test_a_config_of_several_tables_from_python(routed: Routed) -> None:
    orders, refunds = routed.tables
    routed.produce("a1", 30, bad_every=10)
    routed.produce("b", 20)

    assert [c.table for c in api.tables(routed.path)] == [orders, refunds]
    with pytest.raises(ConfigError) as unnamed:
        api.status(routed.path)
    assert "name one with table=" in str(unnamed.value) and "--table" not in str(unnamed.value)

    results = api.run(routed.path, until_caught_up=True)  # every table
    assert sorted((r.records + r.dead_letters) for r in results if r.status == "committed") == [20, 30]
    assert api.status(routed.path, table=refunds).lag == 0
    assert api.verify(routed.path, table=orders).ok and api.check(routed.path, table=refunds).ok
    assert [e.batch for e in api.history(routed.path, table=orders)] == [1]

    routed.produce("a2", 15)
    only = api.run(routed.path, table=orders)
    assert [(r.status, r.records) for r in only] == [("committed", 15)]
    with api.open_run(routed.path, table=refunds) as run:
        assert run.pipeline.config.table == refunds and run.batch().status == "empty"
    with pytest.raises(ConfigError, match=r"has no table 'shop\.nothing'"):
        api.verify(routed.path, table="shop.nothing")
    with pytest.raises(ConfigError, match="is that of table"):
        api.verify(api.load(routed.path, table=orders), table=refunds)
