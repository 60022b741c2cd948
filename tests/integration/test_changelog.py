"""Changelog pipelines (``changes:``) on Apache Kafka: the table equals the fold of the changes."""

from __future__ import annotations

import json
import random
import signal
from typing import Any

import pytest
import yaml

from ingest.assembly import open_pipeline
from ingest.failpoints import POINTS
from ingest.kafka.admin import produce
from tests.integration.conftest import Env, MakeEnv, race
from tests.runs import head_ledger, one_batch

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]

CUSTOMERS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "email", "type": "string"},
    {"name": "visits", "type": "long"},
]


def debezium_stream(count: int, keys: int, seed: int) -> list[tuple[int, dict[str, Any] | None]]:
    """``count`` Debezium events (c/u/d, and the tombstone after each delete) over ``keys`` keys, each
    key's events in one partition (its key mod 2), as (key, event or None)."""
    rng = random.Random(seed)
    rows: dict[int, dict[str, Any]] = {}
    events: list[tuple[int, dict[str, Any] | None]] = []
    while len(events) < count:
        key = rng.randrange(keys)
        before = rows.get(key)
        if before is not None and rng.random() < 0.15:
            events += [(key, {"before": before, "after": None, "op": "d", "source": {}}), (key, None)]
            del rows[key]
            continue
        after = {"id": key, "email": f"{key}-{len(events)}@acme.com", "visits": len(events)}
        events.append((key, {"before": before, "after": after, "op": "u" if before else "c", "source": {}}))
        rows[key] = after
    return events


def fold(events: list[tuple[int, dict[str, Any] | None]]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for key, event in events:
        if event is None:
            continue
        if event["op"] == "d":
            rows.pop(key, None)
        else:
            rows[key] = event["after"]
    return rows


def send(env: Env, events: list[tuple[int, dict[str, Any] | None]], envelope: str = "debezium") -> None:
    """``events`` into the topic, a key's in partition ``key mod partitions``: as Debezium's events,
    or (``upsert``) as an upsert topic's records: the ``after`` image, a delete its tombstone alone."""
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    for key, event in events:
        if envelope == "debezium":
            value = json.dumps(event).encode() if event is not None else None
        elif event is None:
            continue  # (Debezium's tombstone after a delete: an upsert topic's delete is the tombstone alone)
        else:
            value = json.dumps(event["after"]).encode() if event["op"] != "d" else None
        records.append((key % env.partitions, str(key).encode(), value, []))
    produce(env.bootstrap, env.topic, records)


def table_rows(env: Env) -> dict[int, dict[str, Any]]:
    data = open_pipeline(env.config).rows.table.scan().to_arrow().select(["id", "email", "visits"])
    rows = data.to_pylist()
    assert len(rows) == len({r["id"] for r in rows}), "a key has two rows"
    return {r["id"]: r for r in rows}


def changelog(make_env: MakeEnv, max_records: int = 500, envelope: str = "debezium") -> Env:
    """A two-partition topic of customers' changes and its pipeline (``changes:`` keyed by ``id``;
    an upsert topic's keys decoded as strings: a tombstone names its row by its Kafka key alone)."""
    env = make_env(
        partitions=2,
        schema=CUSTOMERS,
        partition_by=[],
        changes={"envelope": envelope, "key": ["id"]},
        batch={"max_records": max_records, "read_timeout_s": 20},
    )
    if envelope == "upsert":
        base = yaml.safe_load(env.config_path.read_text())
        env.config_path.write_text(yaml.safe_dump({**base, "topics": [{"name": env.topic, "key_format": "string"}]}))
    return env


def test_a_debezium_stream_lands_as_the_fold_of_its_changes(make_env: MakeEnv) -> None:
    env = changelog(make_env, max_records=700)
    events = debezium_stream(3_000, 400, seed=7)
    send(env, events[:1_800])
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert table_rows(env) == fold(events[:1_800])
    send(env, events[1_800:])
    result = env.cli("run", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert table_rows(env) == fold(events)
    verified = env.cli("verify", "--json")
    assert verified.stdout, verified.stderr[-3000:]
    report = json.loads(verified.stdout)
    assert report["ok"], report

    # another tool deletes a key's row: verify names the offset of the change that row was
    final = fold(events)
    victim = min(final)
    table = open_pipeline(env.config).rows.table
    row = table.scan(row_filter=f"id == {victim}").to_arrow().to_pylist()[0]
    table.delete(f"id == {victim}")
    report = json.loads(env.cli("verify", "--json").stdout)
    assert not report["ok"]
    missing = {(p["partition"], o) for p in report["partitions"] for o in p["missing"]}
    assert missing == {(row["_kafka_partition"], row["_kafka_offset"])}


def test_a_changelog_replayed_from_a_snapshot_and_published_is_the_fold_again(make_env: MakeEnv) -> None:
    """A replay from the first batch's snapshot re-reads the changes after it on a branch (its row
    deltas on the branch's rows) while the scheduled runs go on; published, main is the fold of every
    change, and verify says so. redrive refuses a changelog, changing nothing. A rollback to that
    snapshot, and the runs after it, come back to the same fold."""
    env = changelog(make_env, max_records=600)
    events = debezium_stream(2_400, 300, seed=11)
    send(env, events[:1_200])
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    at_s = table_rows(env)
    assert env.cli("run", "--until-caught-up").returncode == 0
    replayed = env.cli("replay", "--from-snapshot", str(snapshot_s), "--json")
    assert replayed.returncode == 0, replayed.stderr
    send(env, events[1_200:])
    assert env.cli("run", "--until-caught-up").returncode == 0  # main moves on meanwhile
    published = env.cli("replay", "--from-snapshot", str(snapshot_s), "--publish", "--json")
    assert published.returncode == 0, published.stderr
    assert table_rows(env) == fold(events)
    assert json.loads(env.cli("verify", "--json").stdout)["ok"]

    refused = env.cli("redrive")
    assert refused.returncode == 78 and "changelog" in refused.stderr
    assert table_rows(env) == fold(events)

    # rolled back to the first batch's snapshot, the runs read every later change again
    rolled = env.cli("replay", "--from-snapshot", str(snapshot_s), "--rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert table_rows(env) == at_s
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert table_rows(env) == fold(events)
    assert json.loads(env.cli("verify", "--json").stdout)["ok"]


@pytest.mark.parametrize("envelope", ["debezium", "upsert"])
@pytest.mark.parametrize("point", POINTS)
def test_a_changelog_killed_at_each_step_then_run_again_is_the_fold(
    make_env: MakeEnv, point: str, envelope: str
) -> None:
    env = changelog(make_env, envelope=envelope)
    events = debezium_stream(1_500, 200, seed=3)
    send(env, events, envelope)

    killed = env.cli("run", env={"INGEST_FAILPOINT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    rerun = env.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    assert table_rows(env) == fold(events)
    assert json.loads(env.cli("verify", "--json").stdout)["ok"]


@pytest.mark.parametrize("envelope", ["debezium", "upsert"])
def test_three_racing_copies_with_different_caps_land_the_fold_once(make_env: MakeEnv, envelope: str) -> None:
    env = changelog(make_env, envelope=envelope)
    events = debezium_stream(4_000, 300, seed=5)
    send(env, events, envelope)
    base = yaml.safe_load(env.config_path.read_text())
    paths = []
    for cap in (300, 500, 900):
        path = env.config_path.with_name(f"cap{cap}.yaml")
        path.write_text(yaml.safe_dump({**base, "batch": {**base["batch"], "max_records": cap}}))
        paths.append(path)

    race(paths)

    final = env.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    assert table_rows(env) == fold(events)
    assert json.loads(env.cli("verify", "--json").stdout)["ok"]


def test_an_upsert_topic_with_tombstones_lands_as_the_fold_and_verifies(make_env: MakeEnv) -> None:
    """A compacted, keyed topic: each value its key's row, a tombstone (a null value) deleting the
    key its Kafka key names (``key_format: string``, cast to the key column's type)."""
    env = changelog(make_env, max_records=400, envelope="upsert")
    events = debezium_stream(2_000, 250, seed=9)
    send(env, events, "upsert")
    result = env.cli("run", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert table_rows(env) == fold(events)
    assert json.loads(env.cli("verify", "--json").stdout)["ok"]


def test_verify_of_a_changelog_leaves_out_the_changes_a_forward_reset_skipped(make_env: MakeEnv) -> None:
    """A reset to the latest offsets skips changes: the table is the fold of the others, and verify
    judges it against those (it expected the skipped changes too, and found the rows stale)."""
    env = changelog(make_env, max_records=5_000)
    events = debezium_stream(1_500, 150, seed=19)
    send(env, events[:500])
    assert env.cli("run", "--until-caught-up").returncode == 0
    send(env, events[500:1_000])
    skipped = env.cli("reset", "--to-latest", "--reason", "skip a bad backfill")
    assert skipped.returncode == 0, skipped.stderr
    send(env, events[1_000:])
    assert env.cli("run", "--until-caught-up").returncode == 0

    assert table_rows(env) == fold(events[:500] + events[1_000:])
    verified = env.cli("verify", "--json")
    assert json.loads(verified.stdout)["ok"], verified.stdout[-3000:]
