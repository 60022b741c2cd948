"""Copies of one pipeline that race on the two tables: every record in the rows or the dead
letters exactly once, whatever the interleaving and whatever decoding each copy runs.

Each interleaving is forced deterministically: a copy plans its batch, then (the hook below)
another copy runs whole batches before the first goes on, as a copy paused between its plan and
its commits would see happen. Real broker, real catalogs and files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import config as config_module
from ingest.assembly import Opened, open_pipeline
from ingest.core.plan import Batch
from ingest.kafka.admin import produce
from ingest.ops.replay import replay
from ingest.runner import engine_for
from tests.integration.conftest import Env, KafkaRecord, MakeEnv
from tests.runs import catch_up, one_batch

pytestmark = [pytest.mark.integration, pytest.mark.catalog_race]


def _variant(env: Env, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``env``'s config file, changed by ``change`` (a rolling deploy's other version)."""
    data = yaml.safe_load(env.config_path.read_text())
    change(data)
    path = env.config_path.with_name(f"{env.config_path.stem}-{name}.yaml")
    path.write_text(yaml.safe_dump(data))
    return path


def _pause_after_plan(pipeline: Opened, meanwhile: Callable[[], object]) -> None:
    """Make ``pipeline``'s next plan run ``meanwhile`` right after it: the copy was paused there."""
    plan = pipeline.plan
    armed = [True]

    def paused(*args: Any, **kwargs: Any) -> Batch:
        batch = plan(*args, **kwargs)
        if armed.pop() if armed else False:
            meanwhile()
        return batch

    pipeline.plan = paused  # type: ignore[method-assign]


def _cap(records: int) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["batch"] = {**data["batch"], "max_records": records}

    return change


def test_a_copy_that_settles_a_rollback_late_keeps_the_dead_letters_landed_since(make_env: MakeEnv) -> None:
    """A rollback leaves main on a marker the dead-letter table must follow (its dead letters past
    the rollback point go). A copy planned on that marker, paused, then settles it after another
    copy already settled it and landed a batch with dead letters on top: the late settle must not
    remove those dead letters again, whatever the late copy does next (here its smaller batch)."""
    env = make_env(partitions=1, batch={"max_records": 300, "read_timeout_s": 20})
    env.produce(300, bad_every=10)
    first = open_pipeline(env.config)
    one_batch(first)
    s = first.ledger()
    assert s is not None
    env.produce(300, bad_every=10)
    one_batch(first)
    with engine_for(open_pipeline(env.config)) as run:
        assert replay(run, s.snapshot_id, rollback=True).action == "rolled-back"

    late = open_pipeline(config_module.load(_variant(env, "small", _cap(100))))
    busy = open_pipeline(env.config)
    _pause_after_plan(late, lambda: one_batch(busy))  # it settles the rollback and lands [300, 600)

    one_batch(late)  # planned [300, 400) on the marker: fenced once it goes on

    assert env.counts() == (600 - env.bad, env.bad)
    catch_up(late)
    assert env.counts() == (600 - env.bad, env.bad)
    env.verify()


def test_a_copy_whose_batch_landed_under_another_decoding_adds_no_dead_letters(make_env: MakeEnv) -> None:
    """A rolling deploy of a decoding fix: the old copy has ``amount`` required, the new one
    optional. Both plan the same batch; the new copy lands it (every record a row, no dead
    letters); the old copy, which decoded a tenth of the records as dead letters, must then add
    nothing to either table and say so."""
    env = make_env(partitions=1)
    required = _variant(env, "required", lambda d: d["schema"][1].update(required=True))
    records: list[KafkaRecord] = []
    for i in range(100):
        value = f'{{"order_id": {i}, "created_at": "2026-11-01T10:00:00Z"}}' if i % 10 == 9 else None
        value = value or f'{{"order_id": {i}, "amount": "1.25", "created_at": "2026-11-01T10:00:00Z"}}'
        records.append((0, f"k{i}".encode(), value.encode(), []))
    produce(env.bootstrap, env.topic, records)
    env.produced = 100

    old = open_pipeline(config_module.load(required))
    new = open_pipeline(env.config)
    _pause_after_plan(old, lambda: one_batch(new))

    result = one_batch(old)

    assert result.status == "landed" and result.dead_letters == 0
    assert env.counts() == (100, 0)
    env.verify()
