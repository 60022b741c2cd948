"""Replay from a prior snapshot and ledger resets, against the real broker and catalogs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ingest.core.plan import KafkaView, Watermarks
from ingest.errors import ReplayImpossible
from ingest.pipeline import Pipeline
from tests.runs import catch_up, one_batch, replay_on

pytestmark = pytest.mark.integration


def _run_all(pipeline: Pipeline) -> None:
    for _ in catch_up(pipeline):
        pass


def test_the_same_reset_twice_moves_the_ledger_once(make_env) -> None:
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


def test_reset_to_latest_skips_and_records_who_and_why(make_env) -> None:
    env = make_env()
    env.produce(100)
    result = env.cli("reset", "--to-latest", "--reason", "skip backlog", "--json")
    assert result.returncode == 0, result.stderr
    pipeline = Pipeline.open(env.config)
    summary = pipeline.rows.table.current_snapshot().summary.additional_properties
    assert summary["ingest.orders.reset-reason"] == "skip backlog"
    assert "@" in summary["ingest.orders.reset-by"]
    env.produce(30)
    assert env.cli("run").returncode == 0
    assert env.counts() == (30, 0)
    env.verify()


def test_replay_into_a_branch_then_publish_while_new_data_arrives(make_env) -> None:
    env = make_env(batch={"max_records": 1_000})
    env.produce(1_000, bad_every=25)
    pipeline = Pipeline.open(env.config)
    one_batch(pipeline)
    snapshot_s = pipeline.ledger().snapshot_id  # type: ignore[union-attr]
    env.produce(1_000, bad_every=25)
    one_batch(pipeline)  # the "bad deploy" batch the user wants redone

    first = replay_on(pipeline, snapshot_id=snapshot_s)
    assert first.action == "replayed" and first.batches
    comparison = first.comparison
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


def test_rollback_replay_resumes_from_the_snapshot(make_env) -> None:
    env = make_env()
    env.produce(600, bad_every=30)
    pipeline = Pipeline.open(env.config)
    one_batch(pipeline)
    snapshot_s = pipeline.ledger().snapshot_id  # type: ignore[union-attr]
    ledger_s = pipeline.ledger().ledger  # type: ignore[union-attr]
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


def test_replay_of_offsets_kafka_no_longer_holds_fails_before_changing_anything(make_env, monkeypatch) -> None:
    env = make_env(partitions=2)
    env.produce(200)
    pipeline = Pipeline.open(env.config)
    one_batch(pipeline)
    snapshot_s = pipeline.ledger().snapshot_id  # type: ignore[union-attr]
    env.produce(200)
    one_batch(pipeline)
    committed = pipeline.rows.table.metadata.snapshot_by_id(snapshot_s)
    assert committed is not None
    real = type(pipeline.source).describe

    def retention_ran(self) -> KafkaView:  # type: ignore[no-untyped-def]
        view = real(self)
        return dataclasses.replace(
            view, partitions={tp: Watermarks(wm.high - 10, wm.high) for tp, wm in view.partitions.items()}
        )

    monkeypatch.setattr(type(pipeline.source), "describe", retention_ran)
    snapshots_before = len(pipeline.rows.table.metadata.snapshots)
    with pytest.raises(ReplayImpossible) as caught:
        replay_on(pipeline, snapshot_id=snapshot_s)
    assert f"{env.topic}[0] [100," in str(caught.value)
    pipeline.rows.refresh()
    assert set(pipeline.rows.table.metadata.refs) == {"main"}
    assert len(pipeline.rows.table.metadata.snapshots) == snapshots_before


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize("read_between", [0, 15])
def test_verify_counts_the_net_effect_of_successive_resets(make_env, read_between: int) -> None:
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
def test_verify_says_what_it_checked_and_prints_one_json_document_when_it_fails(make_env) -> None:
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
    rows = Pipeline.open(env.config).rows.table
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
def test_verify_right_after_a_backward_reset_expects_what_is_left_to_read_again(make_env) -> None:
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
def test_a_poison_record_a_forward_reset_skipped_is_a_dead_letter_once_a_backward_reset_reads_it(make_env) -> None:
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
