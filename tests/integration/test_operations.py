"""The operations around the batch next to other writers: expiry, replay, publish, rollback, resets.

Each test races or combines a real operation with another writer on the real catalogs and checks
what a user would see: rows, refs, ledgers and ``ingest verify``.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Sequence

import pytest
import yaml

from ingest.assembly import Opened, open_pipeline
from ingest.core.ledger_codec import find_ledger
from ingest.core.plan import Batch
from ingest.engines.local import LocalEngine
from ingest.errors import PublishRefused, RetryableError
from ingest.intents import Expire, MoveRef, RefIntent, SnapshotIntent
from ingest.kafka.admin import create_topic, produce
from ingest.ops.maintain import expire, maintain
from ingest.ops.replay_result import ReplayResult
from ingest.ports import Produced
from ingest.progress import Advanced, Progress
from ingest.records import Declared
from tests.integration.conftest import Env, KafkaRecord, MakeEnv, race, record
from tests.runs import catch_up, head_ledger, one_batch, replay_on

pytestmark = pytest.mark.integration

#: expire everything the protocol does not protect
EXPIRE_ALL = {"snapshot_retention_hours": 0, "keep_last_snapshots": 1}
HOUR_MS = 3_600_000


def _batches(env: Env, pipeline: Opened, count: int, size: int = 200) -> None:
    for _ in range(count):
        env.produce(size, bad_every=40)
        one_batch(pipeline)


def _run_all(pipeline: Opened) -> None:
    for _ in catch_up(pipeline):
        pass


def _head_id(pipeline: Opened) -> int:
    found = pipeline.ledger()
    assert found is not None
    return found.snapshot_id


@pytest.mark.catalog_race
def test_racing_copies_do_not_rebase_after_a_foreign_writer_turned_library_retries_on(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(1_400, bad_every=7)
    slow, fast = open_pipeline(env.config), open_pipeline(env.config)
    # another tool on the same table (Spark users set this) turns pyiceberg's own commit retry on
    foreign = slow.rows.catalog.load_table(env.config.table)
    foreign.transaction().set_properties({"commit.retry.num-retries": "4"}).commit_transaction()
    slow.rows.refresh()

    class RacedEngine(LocalEngine):
        raced = False

        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)
            if not RacedEngine.raced:
                RacedEngine.raced = True
                assert one_batch(fast).status == "committed"  # the same offsets commit first
            return produced

    result = slow.run_batch(RacedEngine(slow.config, slow.rows))

    assert (result.batch, result.status) == (1, "landed")  # not rebased onto the new head and landed again
    assert env.counts() == (1_400 - env.bad, env.bad)
    env.verify()


@pytest.mark.catalog_race
def test_expiry_racing_a_rollback_keeps_the_snapshot_main_points_at(make_env: MakeEnv) -> None:
    env = make_env(maintenance=EXPIRE_ALL)
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 1)
    snapshot_s = _head_id(pipeline)
    ledger_at_s = head_ledger(pipeline).ledger
    rows_at_s = env.counts()
    _batches(env, pipeline, 3)
    operator = open_pipeline(env.config)
    real = pipeline.rows.commit
    rolled: list[ReplayResult] = []

    def rollback_lands_first(intent: SnapshotIntent | RefIntent) -> int | None:
        if isinstance(intent, Expire) and not rolled:
            rolled.append(replay_on(operator, snapshot_id=snapshot_s, rollback=True))
        return real(intent)

    pipeline.rows.commit = rollback_lands_first  # type: ignore[method-assign, assignment]
    expire(pipeline.rows, pipeline.config.maintenance, int(time.time() * 1000) + HOUR_MS)

    pipeline.rows.refresh()
    main = pipeline.rows.branch_head("main")
    assert main == rolled[0].main  # a snapshot on top of S with S's data and ledger
    assert main is not None and pipeline.rows.table.metadata.snapshot_by_id(main) is not None
    found = pipeline.ledger()
    assert found is not None and found.ledger.offsets == ledger_at_s.offsets
    assert env.counts() == rows_at_s  # the dead letters were rolled back with the rows
    _run_all(pipeline)
    assert env.counts() == (800 - env.bad, env.bad)
    env.verify()


def test_maintain_after_a_replay_and_a_tag_keeps_both_and_the_branch_still_publishes(make_env: MakeEnv) -> None:
    env = make_env(maintenance=EXPIRE_ALL)
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 1)
    snapshot_s = _head_id(pipeline)
    _batches(env, pipeline, 2)
    tagged = _head_id(pipeline)
    pipeline.rows.table.manage_snapshots().create_tag(tagged, "audit-2026-12").commit()
    replayed = replay_on(pipeline, snapshot_id=snapshot_s)  # leaves branch replay-<S> for audit
    _batches(env, pipeline, 2)

    for _ in range(2):  # a second run finds nothing more to expire, and does not fail either
        report = maintain(pipeline, now=time.time() + 3_600)
        assert report.table.snapshots_expired >= 0

    rows = pipeline.rows
    rows.refresh()
    refs = rows.table.metadata.refs
    assert refs["audit-2026-12"].snapshot_id == tagged
    assert rows.table.metadata.snapshot_by_id(tagged) is not None
    assert replayed.branch is not None
    branch_head = rows.branch_head(replayed.branch)
    assert branch_head is not None and rows.table.metadata.snapshot_by_id(branch_head) is not None
    assert find_ledger("orders", rows.ancestry(branch_head)) is not None
    published = replay_on(pipeline, snapshot_id=snapshot_s, publish=True)
    assert published.action == "published"
    assert env.counts() == (1_000 - env.bad, env.bad)
    env.verify()


def test_publish_keeps_another_pipelines_commits_on_main(make_env: MakeEnv) -> None:
    orders = make_env()
    refunds = make_env(pipeline="refunds", table=orders.config.table)
    mine, theirs = open_pipeline(orders.config), open_pipeline(refunds.config)
    _batches(orders, mine, 1, size=500)
    snapshot_s = _head_id(mine)
    _batches(orders, mine, 1, size=500)
    _batches(refunds, theirs, 2, size=300)  # another pipeline writes the same table after S

    published = replay_on(mine, snapshot_id=snapshot_s, publish=True)

    assert published.action == "published"
    assert published.reapplied == 2
    orders.verify()
    refunds.verify()
    assert orders.counts() == (1_600 - orders.bad - refunds.bad, orders.bad + refunds.bad)
    _batches(refunds, theirs, 1, size=100)  # its ledger is still on main: no "ledger lost"
    _batches(orders, mine, 1, size=100)
    refunds.verify()
    orders.verify()
    assert orders.counts() == (1_800 - orders.bad - refunds.bad, orders.bad + refunds.bad)
    mine.rows.refresh()
    assert published.branch not in mine.rows.table.metadata.refs  # the replay's branch is gone


def test_publish_refuses_to_drop_a_foreign_delete_on_main(make_env: MakeEnv) -> None:
    env = make_env(partition_by=[])
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 1, size=500)
    snapshot_s = _head_id(pipeline)
    _batches(env, pipeline, 1, size=500)
    foreign = pipeline.rows.catalog.load_table(env.config.table)
    foreign.delete("_kafka_offset < 5")  # a fix by another tool after S (copy-on-write: an overwrite)
    pipeline.rows.refresh()
    deleted_head = pipeline.rows.branch_head("main")

    with pytest.raises(PublishRefused) as caught:
        replay_on(pipeline, snapshot_id=snapshot_s, publish=True)

    assert f"{deleted_head} (overwrite)" in str(caught.value)
    pipeline.rows.refresh()
    assert pipeline.rows.branch_head("main") == deleted_head  # nothing changed on main


@pytest.mark.catalog_race
def test_rollback_that_loses_the_race_is_retryable_and_changes_nothing(make_env: MakeEnv) -> None:
    env = make_env()
    pipeline = open_pipeline(env.config)
    _batches(env, pipeline, 2)
    snapshot_s = _head_id(pipeline)
    _batches(env, pipeline, 1)
    other = open_pipeline(env.config)
    real = pipeline.rows.commit

    def batch_lands_first(intent: SnapshotIntent | RefIntent) -> int | None:
        if isinstance(intent, MoveRef) and intent.name == "main":  # just before the rollback moves main
            env.produce(100)
            assert one_batch(other).status == "committed"
        return real(intent)

    pipeline.rows.commit = batch_lands_first  # type: ignore[method-assign, assignment]
    with pytest.raises(RetryableError):
        replay_on(pipeline, snapshot_id=snapshot_s, rollback=True)

    found = other.ledger()
    assert found is not None and found.ledger.batch == 4  # the batch that won stays on main
    env.verify()


def test_a_reset_is_applied_once_even_after_its_snapshot_expired(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, maintenance=EXPIRE_ALL)
    env.produce(400)
    assert env.cli("run", "--until-caught-up").returncode == 0
    spec = f"{env.topic}:0=50,{env.topic}:1=60"
    first = env.cli("reset", "--to-offsets", spec, "--reason", "bad deploy 4711", "--json")
    assert first.returncode == 0, first.stderr
    reset_snapshot = json.loads(first.stdout)["snapshot_id"]
    env.produce(100)
    assert env.cli("run", "--until-caught-up").returncode == 0
    pipeline = open_pipeline(env.config)
    maintain(pipeline, now=time.time() + 3_600)
    pipeline.rows.refresh()
    assert pipeline.rows.table.metadata.snapshot_by_id(reset_snapshot) is None  # expired

    again = env.cli("reset", "--to-offsets", spec, "--reason", "bad deploy 4711", "--json")

    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "already-applied"
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (500 + 400 - 110, 0)  # the re-read range once, not twice
    env.verify()


def test_a_run_whose_end_equals_a_reset_is_not_reported_as_landed(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(300)
    pipeline = open_pipeline(env.config)
    batch = pipeline.plan()
    reset = env.cli("reset", "--to-latest", "--reason", "skip the backlog", "--json")
    assert reset.returncode == 0, reset.stderr

    with LocalEngine(pipeline.config, pipeline.rows) as engine:
        result = pipeline._attempt(batch, engine, Progress("", ""))

    assert result is None  # fenced by the reset: its records did not land
    assert env.counts() == (0, 0)
    assert one_batch(pipeline).status == "empty"
    env.verify()


def _null_amounts(env: Env, count: int) -> None:
    """Orders without an amount: rows while ``amount`` is optional, dead letters once it is required."""
    start = env.produced
    records: list[KafkaRecord] = [
        (i % env.partitions, f"k{i}".encode(), json.dumps({"order_id": i, "amount": None}).encode(), [])
        for i in range(start, start + count)
    ]
    produce(env.bootstrap, env.topic, records)
    env.produced += count


def _require_amount(env: Env) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [dict(f, required=True) if f["name"] == "amount" else f for f in data["schema"]]
    env.config_path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize("crash", [False, True], ids=["whole", "killed-between-tables"])
@pytest.mark.parametrize("action", ["--rollback", "--publish"])
def test_records_reread_under_a_stricter_schema_land_once_in_the_table_it_picks(
    make_env: MakeEnv, action: str, crash: bool
) -> None:
    env = make_env()
    env.produce(200, bad_every=20)
    assert env.cli("run").returncode == 0
    snapshot_s = json.loads(env.cli("history", "--json").stdout)[0]["snapshot_id"]
    _null_amounts(env, 100)
    env.produce(200, bad_every=20)  # poison here moves the dead-letter floor past the null amounts
    assert env.cli("run").returncode == 0
    assert env.counts() == (480, 20)
    _require_amount(env)  # the fix being replayed: an order needs an amount

    replayed = env.cli(
        "replay",
        "--from-snapshot",
        str(snapshot_s),
        action,
        env={"INGEST_FAILPOINT": "between-tables"} if crash else {},
    )

    assert replayed.returncode == (-signal.SIGKILL if crash else 0), replayed.stderr
    env.verify()  # killed between the tables: verify judges the dead letters as the next run leaves them
    assert env.cli("run", "--until-caught-up").returncode == 0  # the next scheduled run finishes what was cut
    assert env.counts() == (380, 120)  # the null amounts are dead letters now, once; nothing else moved
    env.verify()
    env.produce(40, bad_every=20)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (418, 122)
    env.verify()
    pipeline = open_pipeline(env.config)
    assert set(pipeline.dead.table.metadata.refs) == {"main"}


@pytest.mark.catalog_race
def test_three_racing_copies_after_a_foreign_writer_turned_library_retries_on(make_env: MakeEnv) -> None:
    env = make_env(batch={"max_records": 500})
    env.produce(4_000, bad_every=17)
    pipeline = open_pipeline(env.config)
    foreign = pipeline.rows.catalog.load_table(env.config.table)
    foreign.transaction().set_properties({"commit.retry.num-retries": "4"}).commit_transaction()

    race([env.config_path] * 3)  # each finished or fenced too often (retryable); they met for certain

    assert env.cli("run", "--until-caught-up").returncode == 0
    env.exact()


def test_a_topic_removed_from_the_config_keeps_its_offsets_and_resumes_when_added_back(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    other = f"{env.topic}_b"
    create_topic(env.bootstrap, other, 2)
    second = [record(i, 2, None) for i in range(100)]
    produce(env.bootstrap, other, second)
    config = yaml.safe_load(env.config_path.read_text())
    both, first_only = [env.topic, other], [env.topic]
    env.config_path.write_text(yaml.safe_dump(config | {"topics": both}))
    env.produce(200)
    assert env.cli("run", "--until-caught-up").returncode == 0

    env.config_path.write_text(yaml.safe_dump(config | {"topics": first_only}))
    env.produce(100)
    alone = env.cli("run", "--until-caught-up")
    assert alone.returncode == 0, alone.stderr  # not "the topic was deleted or recreated"
    produce(env.bootstrap, other, [record(i, 2, None) for i in range(100, 150)])
    env.config_path.write_text(yaml.safe_dump(config | {"topics": both}))
    assert env.cli("run", "--until-caught-up").returncode == 0

    assert env.counts() == (300 + 150, 0)  # the second topic resumed where it stopped: nothing twice
    env.verify()
