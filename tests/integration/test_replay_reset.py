"""Replay from a prior snapshot and ledger resets, against the real broker and catalogs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import config as config_module
from ingest.assembly import Opened, open_pipeline
from ingest.core.ledger_codec import find_ledger, registered_pipelines
from ingest.errors import BranchGone, ReplayImpossible
from ingest.kafka.admin import create_topic
from ingest.runner import engine_for
from tests.integration.conftest import REPO, Env, MakeEnv, needs_apache_kafka, produce_numbered, summary_of
from tests.runs import catch_up, head_ledger, one_batch, replay_on

pytestmark = pytest.mark.integration


def _run_all(pipeline: Opened) -> None:
    for _ in catch_up(pipeline):
        pass


def test_the_same_reset_twice_moves_the_ledger_once(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(400, bad_every=20)
    assert env.cli("run", "--until-caught-up").returncode == 0
    spec = f"{env.topic}:0=50,{env.topic}:1=60"

    first = env.cli("reset", "--to-offsets", spec, "--reason", "bad deploy 4711", "--json")
    second = env.cli("reset", "--to-offsets", spec, "--reason", "bad deploy 4711", "--json")

    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    applied, again = json.loads(first.stdout), json.loads(second.stdout)
    assert applied["status"] == "applied" and again["status"] == "already-applied"
    assert again["snapshot_id"] == applied["snapshot_id"]
    status = json.loads(env.cli("status", "--json").stdout)
    assert [p["committed"] for p in status["partitions"]] == [50, 60]
    history = json.loads(env.cli("history", "--json").stdout)
    assert len(history) == 2  # the batch and one reset, not two
    # the re-read range lands again (that is the point of a reset), exactly once from the reset on
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.verify()
    rows, dead = env.counts()
    assert rows == (400 - env.bad) + (400 - 110) - 14  # re-ingested good rows after the reset point
    assert dead == env.bad  # dead letters are not duplicated: their ledger is a floor


def test_reset_to_latest_skips_and_records_who_and_why(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(100)
    result = env.cli("reset", "--to-latest", "--reason", "skip backlog", "--json")
    assert result.returncode == 0, result.stderr
    pipeline = open_pipeline(env.config)
    summary = summary_of(pipeline.rows.table.current_snapshot())
    assert summary["ingest.orders.reset-reason"] == "skip backlog"
    assert "@" in summary["ingest.orders.reset-by"]
    env.produce(30)
    assert env.cli("run").returncode == 0
    assert env.counts() == (30, 0)
    env.verify()


def test_replay_into_a_branch_then_publish_while_new_data_arrives(make_env: MakeEnv) -> None:
    env = make_env(batch={"max_records": 1_000})
    env.produce(1_000, bad_every=25)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(1_000, bad_every=25)
    one_batch(pipeline)  # the "bad deploy" batch the user wants redone

    first = replay_on(pipeline, snapshot_id=snapshot_s)
    assert first.action == "replayed" and first.batches
    comparison = first.comparison
    assert comparison is not None and first.branch is not None
    assert sum(r.branch_rows for r in comparison) == sum(r.main_rows for r in comparison)
    assert pipeline.rows.branch_head("main") != pipeline.rows.branch_head(first.branch)

    env.produce(500, bad_every=25)  # new data, and the scheduled run ingests it into main meanwhile
    one_batch(pipeline)

    published = replay_on(pipeline, snapshot_id=snapshot_s, publish=True)

    assert published.action == "published"
    assert pipeline.rows.branch_head("main") == published.published
    assert env.counts() == (2_500 - env.bad, env.bad)
    env.verify()
    env.produce(100)
    _run_all(pipeline)
    assert env.counts() == (2_600 - env.bad, env.bad)
    env.verify()


def test_rollback_replay_resumes_from_the_snapshot(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(600, bad_every=30)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    ledger_s = head_ledger(pipeline).ledger
    rows_at_s = env.counts()
    env.produce(600, bad_every=30)
    one_batch(pipeline)

    result = env.cli("replay", "--from-snapshot", str(snapshot_s), "--rollback", "--json")

    assert result.returncode == 0, result.stderr
    rolled_back = pipeline.ledger()
    assert rolled_back is not None and rolled_back.ledger.offsets == ledger_s.offsets
    assert [s.snapshot_id for s in pipeline.rows.ancestry()][1] == snapshot_s  # main = S's data and ledger
    assert env.counts() == rows_at_s
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (1_200 - env.bad, env.bad)
    env.verify()


def test_a_rollback_registers_the_pipeline_where_its_rewind_is_the_first_dead_letter_ledger(make_env: MakeEnv) -> None:
    """With no dead letter yet, a rollback's rewind is the pipeline's first ledger on the dead-letter
    table: it registers the pipeline there in the same commit (expiry keeps registered ledgers)."""
    env = make_env()
    env.produce(300)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(300)
    one_batch(pipeline)

    result = env.cli("replay", "--from-snapshot", str(snapshot_s), "--rollback", "--json")

    assert result.returncode == 0, result.stderr
    dead = open_pipeline(env.config).dead
    assert registered_pipelines(dead.refresh().properties) == ["orders"]
    assert find_ledger("orders", dead.ancestry()) is not None
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (600, 0)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_replay_whose_branch_another_replay_published_stops_saying_so(make_env: MakeEnv) -> None:
    """Two copies of ``ingest replay --from-snapshot S --publish``: the first publishes the branch
    (and removes it) while the second still works on it. The second stops with a retryable error
    naming the branch, not a crash, and main holds every record once."""
    env = make_env(partitions=2)
    env.produce(400, bad_every=20)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(400, bad_every=20)
    one_batch(pipeline)
    assert env.cli("replay", "--from-snapshot", str(snapshot_s)).returncode == 0  # the branch, caught up
    with engine_for(open_pipeline(env.config)) as second:
        on_branch = second.on_branch(f"replay-{snapshot_s}")  # the second copy, mid-replay
        env.produce(50)
        published = env.cli("replay", "--from-snapshot", str(snapshot_s), "--publish")
        assert published.returncode == 0, published.stderr

        with pytest.raises(BranchGone, match=f"branch replay-{snapshot_s} of .* no longer exists"):
            list(on_branch.batches(until_caught_up=True))
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (850 - env.bad, env.bad)
    env.verify()


@dataclasses.dataclass
class _TwoPipelines:
    """``orders`` (the test's env) and ``refunds`` (a topic of its own) into one table and one
    dead-letter table, each driven through the CLI."""

    env: Env
    refunds_path: Path
    refunds_topic: str
    refunds_produced: int = 0
    refunds_bad: int = 0

    @classmethod
    def make(cls, env: Env, **config: Any) -> _TwoPipelines:
        topic = f"{env.topic}_refunds"
        create_topic(env.bootstrap, topic, 1)
        data = {**yaml.safe_load(env.config_path.read_text()), **config}
        env.config_path.write_text(yaml.safe_dump(data))
        path = env.config_path.with_name("refunds.yaml")
        path.write_text(yaml.safe_dump({**data, "pipeline": "refunds", "topics": [topic]}))
        return cls(env, path, topic)

    def refund(self, count: int) -> None:
        self.refunds_bad += produce_numbered(self.env, self.refunds_topic, 1, self.refunds_produced, count, 25)
        self.refunds_produced += count

    def ingest(self, *args: str, refunds: bool = False) -> subprocess.CompletedProcess[str]:
        path = self.refunds_path if refunds else self.env.config_path
        command = [sys.executable, "-m", "ingest", *args, "-c", str(path)]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO)

    def ledger_snapshot(self, refunds: bool = False) -> int:
        path = self.refunds_path if refunds else self.env.config_path
        return head_ledger(open_pipeline(config_module.load(path))).snapshot_id

    def exact(self) -> None:
        for refunds in (False, True):
            assert self.ingest("run", "--until-caught-up", refunds=refunds).returncode == 0
            checked = self.ingest("verify", refunds=refunds)
            assert checked.returncode == 0, checked.stdout
        env = self.env
        rows, dead = env.counts()
        expected_rows = env.produced - env.bad + self.refunds_produced - self.refunds_bad
        assert (rows, dead) == (expected_rows, env.bad + self.refunds_bad)


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize("rolled_back", ["past-the-fork", "since-the-fork"])
def test_a_publish_after_another_pipelines_rollback_is_refused_changing_nothing(
    make_env: MakeEnv, rolled_back: str
) -> None:
    """Two pipelines on one table (and one dead-letter table). ``refunds`` replays from S into a
    branch; meanwhile ``orders`` rolls main back: past S (the branch holds orders' rows main has
    dropped, which orders reads again) or to a snapshot since S (its dead letters were rewound on
    the dead-letter table's main, which the publish cannot carry over). Either way the publish is
    refused before anything changes (before, the first stored orders' rows twice, the second moved
    the rows table and then refused the dead letters at every run), and both pipelines go on
    exactly once."""
    env = make_env(partitions=1)
    two = _TwoPipelines.make(env)
    two.refund(100)
    assert two.ingest("run", refunds=True).returncode == 0
    env.produce(100, bad_every=25)
    assert two.ingest("run").returncode == 0
    before_fork = two.ledger_snapshot()
    env.produce(100, bad_every=25)
    assert two.ingest("run").returncode == 0  # in the branch below; gone from main after a rollback past it
    two.refund(100)
    assert two.ingest("run", refunds=True).returncode == 0
    s_refunds = two.ledger_snapshot(refunds=True)
    env.produce(100, bad_every=25)
    assert two.ingest("run").returncode == 0
    since_fork = two.ledger_snapshot()
    env.produce(100, bad_every=25)
    assert two.ingest("run").returncode == 0  # its dead letters are rewound by a rollback to since_fork
    assert two.ingest("replay", "--from-snapshot", str(s_refunds), refunds=True).returncode == 0
    target = before_fork if rolled_back == "past-the-fork" else since_fork
    assert two.ingest("replay", "--from-snapshot", str(target), "--rollback").returncode == 0
    pipeline = open_pipeline(env.config)
    heads = (pipeline.rows.branch_head("main"), pipeline.dead.branch_head("main"))

    published = two.ingest("replay", "--from-snapshot", str(s_refunds), "--publish", refunds=True)

    assert published.returncode == 65, published.stderr
    said = " ".join(published.stderr.split())
    assert "Nothing was changed" in said and f"publish of replay-{s_refunds}" in said
    pipeline = open_pipeline(env.config)
    assert (pipeline.rows.branch_head("main"), pipeline.dead.branch_head("main")) == heads
    two.exact()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_publish_keeps_the_ledger_of_a_pipeline_only_a_compaction_carried(make_env: MakeEnv) -> None:
    """``ingest maintain`` compacted the table (its snapshot re-stamps both pipelines' ledgers) and
    expired ``refunds``' own snapshots; ``orders`` then replays from a snapshot below the compaction
    whose parents are gone too, and publishes. Compactions are not carried over, so main lost the
    only ledger of ``refunds`` (its runs failed closed, LedgerLost); the publish re-stamps it."""
    env = make_env(partitions=1)
    two = _TwoPipelines.make(env, maintenance={"keep_last_snapshots": 2, "snapshot_retention_hours": 0})
    two.refund(100)
    assert two.ingest("run", refunds=True).returncode == 0
    env.produce(100, bad_every=25)
    assert two.ingest("run").returncode == 0
    s_orders = two.ledger_snapshot()
    assert two.ingest("maintain").returncode == 0
    rows = open_pipeline(env.config).rows
    assert [s.snapshot_id for s in rows.ancestry()][1:] == [s_orders]  # the compaction, then S: its parent expired
    env.produce(100, bad_every=25)
    two.refund(50)

    published = two.ingest("replay", "--from-snapshot", str(s_orders), "--publish")

    assert published.returncode == 0, published.stderr
    two.exact()


@needs_apache_kafka
def test_replay_of_offsets_kafka_no_longer_holds_fails_before_changing_anything(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(200)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(200)
    one_batch(pipeline)
    committed = pipeline.rows.table.metadata.snapshot_by_id(snapshot_s)
    assert committed is not None
    env.delete_records({0: 190, 1: 190})  # retention ran: each partition keeps its last 10 records

    snapshots_before = len(pipeline.rows.table.metadata.snapshots)
    with pytest.raises(ReplayImpossible) as caught:
        replay_on(pipeline, snapshot_id=snapshot_s)
    assert f"{env.topic}[0] [100," in str(caught.value)
    pipeline.rows.refresh()
    assert set(pipeline.rows.table.metadata.refs) == {"main"}
    assert len(pipeline.rows.table.metadata.snapshots) == snapshots_before


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize("read_between", [0, 15])
def test_verify_counts_the_net_effect_of_successive_resets(make_env: MakeEnv, read_between: int) -> None:
    """``reset --to-earliest`` then ``--to-latest`` (with nothing, or part of the re-read range,
    ingested between): each offset is expected as many times as the ledger's moves read it
    (once, plus once per backward reset over it, less once per forward one), not "missing" and
    "unexpected" at once, forever."""
    env = make_env(partitions=1, batch={"max_records": 15})
    env.produce(40)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.cli("reset", "--to-earliest", "--reason", "re-read").returncode == 0
    if read_between:
        assert env.cli("run").returncode == 0  # one batch: offsets 0..14 land a second time
    assert env.cli("reset", "--to-latest", "--reason", "never mind").returncode == 0

    checked = env.verify()

    (partition,) = checked["partitions"]
    assert partition["rows"] == 40 + read_between
    env.produce(10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.verify()["partitions"][0]["rows"] == 50 + read_between


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_verify_says_what_it_checked_and_prints_one_json_document_when_it_fails(make_env: MakeEnv) -> None:
    env = make_env(partitions=1)
    nothing = env.cli("verify")
    assert nothing.returncode == 0 and "nothing committed yet" in nothing.stdout
    assert "there is nothing to verify" in " ".join(nothing.stdout.split())
    env.produce(20)
    assert env.cli("run").returncode == 0
    assert env.cli("reset", "--to-offsets", f"{env.topic}:0=10", "--reason", "re-read").returncode == 0
    assert env.cli("run").returncode == 0

    said = env.cli("verify")

    assert said.returncode == 0, said.stderr
    assert (
        f"re-read on purpose (a backward reset): expected once more in the rows: {env.topic}[0] [10, 20)"
        in " ".join(said.stdout.split())
    )
    rows = open_pipeline(env.config).rows.table
    copy = rows.scan(row_filter="_kafka_offset < 10", limit=1).to_arrow()  # a record the ledger read once
    rows.append(copy)  # a copy of its row: a duplicate no ledger accounts for
    env.produce(5)
    assert env.cli("run").returncode == 0  # the next ledger's snapshot holds the copy
    failed = env.cli("verify", "--json")
    assert failed.returncode == 65, failed.stderr
    (document,) = failed.stdout.splitlines()
    data = json.loads(document)
    assert data["ok"] is False and data["partitions"][0]["duplicated"] == copy["_kafka_offset"].to_pylist()
    assert data["changed_by_other_writers"] == []  # before the pipeline's last commit: no other writer's since
    assert "verification failed" in failed.stderr


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_verify_right_after_a_backward_reset_expects_what_is_left_to_read_again(make_env: MakeEnv) -> None:
    """The rows above a backward reset's target were read once and are to be read again: until
    then they are neither missing nor unexpected."""
    env = make_env(partitions=1)
    env.produce(40, bad_every=10)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.cli("reset", "--to-offsets", f"{env.topic}:0=25", "--reason", "re-read").returncode == 0

    checked = env.verify()

    assert checked["reread_ranges"] == [{"topic": env.topic, "partition": 0, "start": 25, "end": 40}]
    (partition,) = checked["partitions"]
    assert (partition["end"], partition["checked_to"], partition["rows"]) == (25, 40, 36)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.verify()["partitions"][0]["rows"] == (40 - 4) + (15 - 2)


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_poison_record_a_forward_reset_skipped_is_a_dead_letter_once_a_backward_reset_reads_it(
    make_env: MakeEnv,
) -> None:
    """Partition 1 skipped to its end, a batch of partition 0 (whose dead letters move the
    dead-letter ledger past partition 1's skipped range too), then everything read again from
    the earliest offset: partition 1's poison records are dead letters, not in neither table."""
    env = make_env(partitions=2)
    env.produce(200, bad_every=5)  # records alternate between the partitions: poison in both
    ends = {p["partition"]: p["end"] for p in json.loads(env.cli("status", "--json").stdout)["partitions"]}
    skip = f"{env.topic}:0=0,{env.topic}:1={ends[1]}"
    assert env.cli("reset", "--to-offsets", skip, "--reason", "skip partition 1").returncode == 0
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.cli("reset", "--to-earliest", "--reason", "read it all").returncode == 0

    assert env.cli("run", "--until-caught-up").returncode == 0

    env.verify()
    _, dead = env.counts()
    assert dead == env.bad


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_rollback_to_a_backward_reset_keeps_the_dead_letters_its_line_read(make_env: MakeEnv) -> None:
    """Everything read (its poison records dead letters), a reset to the earliest offset, a rollback
    to that reset, then a reset to the latest: the records the first batches read as poison are still
    dead letters (the rollback rewinds the dead letters to what its snapshot's line had read, not to
    its offsets, which the backward reset had taken below them)."""
    env = make_env()
    env.produce(200, bad_every=20)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.cli("reset", "--to-earliest", "--reason", "read it all again").returncode == 0
    reset_snapshot = head_ledger(open_pipeline(env.config)).snapshot_id

    rolled = env.cli("replay", "--from-snapshot", str(reset_snapshot), "--rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert env.cli("reset", "--to-latest", "--reason", "no need after all").returncode == 0

    assert env.counts() == (200 - env.bad, env.bad)
    env.verify()


def test_a_replay_that_stores_the_first_dead_letters_leaves_main_runs_going(make_env: MakeEnv) -> None:
    """The dead-letter table's main has none of the pipeline's dead letters, so no ledger of it, when
    a replay's branch stores the first: that registers the pipeline on the whole table (its
    properties are not per branch). The scheduled runs then store dead letters on main as before,
    not fail for a ledger main never had."""
    env = make_env()
    env.produce(50)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(50, bad_every=10)

    replayed = env.cli("replay", "--from-snapshot", str(snapshot_s), "--json")  # for audit: main stays
    assert replayed.returncode == 0, replayed.stderr
    run = env.cli("run", "--until-caught-up")

    assert run.returncode == 0, run.stderr
    assert env.counts() == (100 - env.bad, env.bad)
    env.verify()


def _published_replay(env: Env) -> tuple[Opened, int]:
    """A batch (snapshot S), more records, and a replay from S published; the pipeline and S."""
    env.produce(50, bad_every=10)
    pipeline = open_pipeline(env.config)
    one_batch(pipeline)
    snapshot_s = head_ledger(pipeline).snapshot_id
    env.produce(50, bad_every=10)
    assert env.cli("replay", "--from-snapshot", str(snapshot_s), "--publish").returncode == 0
    return pipeline, snapshot_s


def test_a_replay_again_from_a_snapshot_whose_published_branch_was_left_behind_replays_anew(
    make_env: MakeEnv,
) -> None:
    """A publish could not remove its rows branch (it logs so), and main was rolled back off its line
    since: running the same replay later begins a new one from S instead of continuing the old line
    (whose dead letters the rollback removed)."""
    env = make_env()
    pipeline, snapshot_s = _published_replay(env)
    rows = pipeline.rows
    rows.refresh()
    published = rows.branch_head("main")
    assert published is not None
    rows.table.manage_snapshots().create_branch(published, f"replay-{snapshot_s}").commit()  # left behind
    rolled_back = env.cli("replay", "--from-snapshot", str(snapshot_s), "--rollback")  # main leaves that line
    assert rolled_back.returncode == 0, rolled_back.stderr
    env.produce(50, bad_every=10)
    assert env.cli("run", "--until-caught-up").returncode == 0

    again = env.cli("replay", "--from-snapshot", str(snapshot_s), "--publish", "--json")

    assert again.returncode == 0, again.stderr
    assert env.counts() == (150 - env.bad, env.bad)
    env.verify()


def test_a_second_replay_from_the_same_snapshot_publishes_its_own_dead_letters(make_env: MakeEnv) -> None:
    """Two replays from one snapshot S, each published: the second's dead letters are its own, not
    taken for the first's already done."""
    env = make_env()
    _, snapshot_s = _published_replay(env)
    env.produce(50, bad_every=10)

    again = env.cli("replay", "--from-snapshot", str(snapshot_s), "--publish", "--json")

    assert again.returncode == 0, again.stderr
    assert env.counts() == (150 - env.bad, env.bad)
    env.verify()
