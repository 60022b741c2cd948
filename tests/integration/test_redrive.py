"""``ingest redrive``: dead letters that decode after a fix move to the rows exactly once, through
crashes between the two tables, racing copies, and batches planned before it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
import yaml

from ingest.assembly import open_pipeline
from ingest.intents import Append, RemoveDeadLetters
from ingest.ops.redrive import Redrive, redrive
from tests.integration.conftest import MakeEnv, summary_of
from tests.runs import one_batch

from .conftest import SCHEMA, Env, contend

pytestmark = pytest.mark.integration
#: the catalog of every test here but the racing copies' (catalog_race: the catalogs the other races run on)
SQLITE = pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)

#: created_at required: records without it are dead letters until the fix makes it optional
STRICT = [{**f, "required": True} if f["name"] == "created_at" else f for f in SCHEMA]


def _setup(make_env: MakeEnv) -> Env:
    """40 orders on 2 partitions: 8 poison for good (BAD_VALUES), 6 without created_at."""
    env = make_env(partitions=2, schema=STRICT)
    env.produce(40, bad_every=5)
    undated = [json.dumps({"order_id": i, "amount": "1.50"}).encode() for i in range(40, 46)]
    # (logged as rows, which they are once redriven after the fix)
    env.send(env.topic, [(i % 2, None, value, None) for i, value in enumerate(undated)])
    env.produced = 46
    result = env.cli("run", "--until-caught-up", "--json")
    assert result.returncode == 0, result.stderr
    assert env.counts() == (32, 14)
    return env


def _json(env: Env, *args: str) -> dict[str, Any]:
    result = env.cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _history(env: Env) -> list[dict[str, Any]]:
    result = env.cli("history", "--json")
    assert result.returncode == 0, result.stderr
    entries: list[dict[str, Any]] = json.loads(result.stdout)
    return entries


def _fix(env: Env) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = SCHEMA  # created_at optional
    env.config_path.write_text(yaml.safe_dump(data))


def _summaries(env: Env) -> tuple[dict[str, str], dict[str, str]]:
    pipeline = open_pipeline(env.config)
    return summary_of(pipeline.rows.table.current_snapshot()), summary_of(pipeline.dead.table.current_snapshot())


@SQLITE
def test_dead_letters_that_decode_after_a_fix_move_to_the_rows_once(make_env: MakeEnv) -> None:
    env = _setup(make_env)
    assert _json(env, "redrive")["redriven"] == 0  # nothing decodes before the fix
    dead = _json(env, "status")["dead_letters"]  # status shows them, with the newest reasons
    assert dead["count"] == 14 and dead["newest_ms"] is not None
    assert dict(dead["reasons"])["required field(s) 'created_at' missing or null"] == 6
    _fix(env)

    dry = _json(env, "redrive", "--dry-run")
    assert (dry["examined"], dry["redriven"], dry["still_dead"], dry["snapshots"]) == (14, 6, 8, [])
    assert env.counts() == (32, 14)  # a dry run changes nothing

    report = _json(env, "redrive")
    assert (report["examined"], report["redriven"], report["still_dead"], len(report["snapshots"])) == (14, 6, 8, 1)
    assert env.counts() == (38, 8)
    assert _json(env, "status")["dead_letters"]["count"] == 8
    assert "8 dead letters" in env.cli("status").stdout
    [entry, *_] = _history(env)  # the redrive is in the history, naming what it moved
    assert (
        entry["records"] == 6 and entry["ranges"] == [] and sum(s["end"] - s["start"] for s in entry["redriven"]) == 6
    )
    assert "redrive" in env.cli("history").stdout  # (wrapped at 80 columns)
    rows, dead = _summaries(env)
    assert dead["ingest.orders.synced-by"] == rows["ingest.orders.redrive-id"]  # the dead letters say what went
    assert dead["ingest.orders.redriven"] == "6"
    env.verify()
    ids = open_pipeline(env.config).rows.scan_columns(["order_id"])["order_id"].to_pylist()
    assert sorted(i for i in ids if i >= 40) == list(range(40, 46))

    again = _json(env, "redrive")  # an orchestrator's retry: nothing twice
    assert (again["examined"], again["redriven"], again["snapshots"]) == (8, 0, [])
    env.produce(10)  # and the batches go on from the same ledger
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (48, 8)
    env.verify()


@SQLITE
@pytest.mark.parametrize("finisher", ["redrive", "run"])
def test_a_redrive_killed_between_the_two_tables_is_finished_by_the_next_command(
    make_env: MakeEnv, finisher: str
) -> None:
    env = _setup(make_env)
    _fix(env)

    killed = env.cli("redrive", env={"INGEST_FAILPOINT": "between-tables"})

    assert killed.returncode == -9
    assert env.counts() == (38, 14)  # the rows committed, their dead letters not removed yet
    assert _json(env, "redrive", "--dry-run")["examined"] == 8  # it knows
    env.produce(4)
    assert env.cli(finisher, *(["--until-caught-up"] if finisher == "run" else [])).returncode == 0
    rows, dead = env.counts()
    assert dead == 8 and rows == (38 if finisher == "redrive" else 42)
    env.verify()


@pytest.mark.catalog_race
def test_racing_redrives_move_each_dead_letter_once(make_env: MakeEnv) -> None:
    """Three copies of ``ingest redrive``: the first decodes the six and writes their rows, then waits
    (its files written, its commit not tried) until another copy has redriven them; it goes on to
    find them taken, and commits nothing."""
    env = _setup(make_env)
    _fix(env)
    redrive_json = [sys.executable, "-m", "ingest", "redrive", "--json", "-c", str(env.config_path)]

    copies = contend(
        [(redrive_json, None)] * 3,
        moved=lambda report: bool(report.get("snapshots")),
        met=lambda first: [(r["redriven"], r["snapshots"]) for r in first.lines] == [(6, [])],
        codes=(0,),
    )

    assert sum(len(copy.lines[0]["snapshots"]) for copy in copies) >= 1
    env.exact()


@SQLITE
def test_a_batch_planned_before_a_redrive_is_fenced_and_settles_it_before_it_commits(make_env: MakeEnv) -> None:
    env = _setup(make_env)
    _fix(env)
    env.produce(6)
    running = open_pipeline(env.config)
    planned = running.plan()  # a batch in flight on the ledger before the redrive

    done = redrive(open_pipeline(env.config))

    assert done.redriven == 6
    from ingest.runner import engine_for

    with engine_for(running) as run:
        assert run.pipeline._attempt(planned, run.engine, run.progress) is None  # fenced: the ledger moved under it
    assert one_batch(running).status == "committed"
    assert env.counts() == (44, 8)
    env.verify()


@SQLITE
def test_a_redrive_overtaken_by_another_commits_only_what_is_still_dead(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as the racing copies above, in one process: the other copy commits everything between this
    # one's decoding and its commit (here before it writes its files)
    import ingest.ops.redrive as module

    env = _setup(make_env)
    _fix(env)
    real = module._groups
    raced: list[Redrive] = []

    def overtaken(rows: pa.Table, max_records: int) -> Iterator[pa.Table]:
        if not raced:
            monkeypatch.setattr(module, "_groups", real)  # the other copy runs unhindered
            raced.append(redrive(open_pipeline(env.config)))
        yield from real(rows, max_records)

    monkeypatch.setattr(module, "_groups", overtaken)
    mine = redrive(open_pipeline(env.config))

    assert raced[0].redriven == 6 and len(raced[0].snapshots) == 1
    assert mine.redriven == 6 and mine.snapshots == []  # decoded, but all taken by then
    assert env.counts() == (38, 8)
    env.verify()


@SQLITE
@pytest.mark.parametrize("mode", ["--rollback", "--branch"])
def test_a_replay_from_before_a_redrive_of_its_records_is_refused_changing_nothing(
    make_env: MakeEnv, mode: str
) -> None:
    from ingest.errors import ExitCode

    env = _setup(make_env)
    before = open_pipeline(env.config).rows.branch_head("main")
    _fix(env)
    assert _json(env, "redrive")["redriven"] == 6
    head = open_pipeline(env.config).rows.branch_head("main")

    refused = env.cli("replay", "--from-snapshot", str(before), *([mode] if mode == "--rollback" else []))

    assert refused.returncode == ExitCode.FATAL, refused.stderr
    assert "ingest redrive" in refused.stderr and f"Replay from snapshot {head}" in refused.stderr
    assert open_pipeline(env.config).rows.branch_head("main") == head
    assert env.counts() == (38, 8)
    env.verify()


@SQLITE
def test_the_removal_of_a_commit_naming_a_thousand_offset_ranges_binds_and_deletes(make_env: MakeEnv) -> None:
    # one redrive commit names up to MAX_SPANS ranges; an Or chain of them was ~1,000 levels deep and
    # pyiceberg's binding (recursive) failed from ~485: the removal, and every batch after, stopped
    from ingest.core.ledger import TopicPartition
    from ingest.ops.redrive import MAX_SPANS
    from ingest.records import DEAD_LETTER_SCHEMA

    env = make_env(partitions=1)
    dead = open_pipeline(env.config).dead
    offsets = [o for o in range(3 * MAX_SPANS) if o % 3 != 2]  # pairs: one range of two per three offsets
    n = len(offsets)
    letters = pa.table(
        {
            "topic": [env.topic] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.nulls(n, pa.timestamp("us", tz="UTC")),
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array([b"{}"] * n, pa.binary()),
            "headers": pa.array([[]] * n, DEAD_LETTER_SCHEMA.field("headers").type),
            "error": ["bad"] * n,
        },
        schema=DEAD_LETTER_SCHEMA,
    )
    dead.commit(Append(dead.write(letters), {}))
    spans = {TopicPartition(env.topic, 0): tuple((3 * k, 3 * k + 2) for k in range(MAX_SPANS - 1))}

    dead.commit(RemoveDeadLetters(spans, {"ingest.test": "removal"}))

    dead.refresh()
    assert dead.scan_columns(["offset"])["offset"].to_pylist() == offsets[-2:]  # the last range was not named
