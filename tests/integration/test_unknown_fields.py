"""``unknown_fields``: JSON fields the table does not declare are counted in the batch summary, and
captured into ``_extra`` or made dead letters, end to end (Kafka, the CLI, the Iceberg tables)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from ingest.assembly import open_pipeline
from ingest.kafka.admin import produce
from tests.integration.conftest import MakeEnv, summary_of

from .conftest import Env

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]


def _send(env: Env, first: int, count: int) -> None:
    """Orders; every third has fields the table does not declare."""
    records = []
    for i in range(first, first + count):
        order: dict[str, Any] = {"order_id": i, "amount": "2.50", "created_at": "2026-11-02T10:00:00Z"}
        if i % 3 == 0:
            order |= {"coupon": f"C{i}", "channel": {"app": "ios"}}
        records.append((i % 2, None, json.dumps(order).encode(), None))
    produce(env.bootstrap, env.topic, records)
    env.produced += count


def _run(env: Env) -> list[dict[str, Any]]:
    result = env.cli("run", "--until-caught-up", "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _set(env: Env, mode: str) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    env.config_path.write_text(yaml.safe_dump({**data, "unknown_fields": mode}))


def test_unknown_fields_captured_then_refused_then_redriven_into_the_column(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    _set(env, "capture")
    _send(env, 0, 30)

    [batch] = _run(env)

    assert batch["unknown_fields"] == 10 and batch["records"] == 30
    pipeline = open_pipeline(env.config)
    summary = summary_of(pipeline.rows.table.current_snapshot())
    assert summary["ingest.orders.unknown-fields"] == "10"
    rows = pipeline.rows.scan_columns(["order_id", "_extra"]).sort_by("order_id").to_pylist()
    assert json.loads(rows[3]["_extra"]) == {"coupon": "C3", "channel": {"app": "ios"}}
    assert [r["order_id"] for r in rows if r["_extra"] is not None] == list(range(0, 30, 3))

    _set(env, "dead_letter")  # the next records with unknown fields are refused
    _send(env, 30, 12)
    [batch] = _run(env)
    assert (batch["records"], batch["dead_letters"], batch["unknown_fields"]) == (8, 4, 4)
    assert env.counts() == (38, 4)
    env.verify()

    _set(env, "capture")  # and taken after all: redrive captures their fields
    redriven = json.loads(env.cli("redrive", "--json").stdout)
    assert redriven["redriven"] == 4
    assert env.counts() == (42, 0)
    rows = open_pipeline(env.config).rows.scan_columns(["order_id", "_extra"]).to_pylist()
    assert sum(r["_extra"] is not None for r in rows) == 14
    env.verify()
