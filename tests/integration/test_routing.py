"""Topics chosen by a pattern (``topics_pattern:``) and routed to several tables (``tables:``),
against the real broker and catalogs: exact counts per table and ``verify`` after crashes and races."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import yaml

from ingest.failpoints import POINTS
from ingest.kafka.admin import create_topic, produce
from tests.integration.conftest import REPO, Env, MakeEnv, Routed, produce_numbered, race, record

pytestmark = pytest.mark.integration


def _by_pattern(env: Env, pattern: str) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    del data["topics"]
    data["topics_pattern"] = pattern
    env.config_path.write_text(yaml.safe_dump(data))


def test_a_topic_created_mid_run_that_matches_is_read_from_its_earliest_offset(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    _by_pattern(env, f"{env.topic}(_.*)?")
    unrelated = f"x{env.topic}"  # matches only a search, not the whole name
    create_topic(env.bootstrap, unrelated, 1)
    produce(env.bootstrap, unrelated, [record(i, 1, None) for i in range(50)])
    env.produce(1_500, bad_every=97)

    first = env.cli("run", "--until-caught-up", "--json")
    assert first.returncode == 0, first.stderr
    assert env.counts() == (1_500 - env.bad, env.bad)

    late = f"{env.topic}_late"
    create_topic(env.bootstrap, late, 3)
    late_bad = produce_numbered(env, late, 3, 0, 900, bad_every=61)  # written before the next run sees the topic
    env.produce(500)
    second = env.cli("run", "--until-caught-up", "--json")

    assert second.returncode == 0, second.stderr
    rows, dead = env.counts()
    assert (rows, dead) == (2_000 - env.bad + 900 - late_bad, env.bad + late_bad)
    status = json.loads(env.cli("status", "--json").stdout)
    topics = {p["topic"] for p in status["partitions"]}
    assert topics == {env.topic, late}
    data = env.verify()
    assert sum(p["rows"] + p["dead_letters"] for p in data["partitions"]) == 2_900
    check = env.cli("check")
    assert check.returncode == 0, check.stdout + check.stderr
    said = " ".join(check.stdout.split())  # wrapped to the terminal's width
    assert f"5 partitions of {env.topic}, {late} (matching '{env.topic}(_.*)?')" in said


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
@pytest.mark.parametrize("how", ["--rollback", "--publish"])
def test_a_rollback_past_a_topics_first_read_removes_its_dead_letters_too(make_env: MakeEnv, how: str) -> None:
    env = make_env(partitions=2)
    _by_pattern(env, f"{env.topic}(_.*)?")
    env.produce(400, bad_every=23)
    assert env.cli("run", "--until-caught-up").returncode == 0
    history = json.loads(env.cli("history", "--json").stdout)
    snapshot_s = history[0]["snapshot_id"]
    late = f"{env.topic}_late"
    create_topic(env.bootstrap, late, 1)
    late_bad = produce_numbered(env, late, 1, 0, 300, bad_every=7)  # first read after S, poison in it
    assert env.cli("run", "--until-caught-up").returncode == 0

    replayed = env.cli("replay", "--from-snapshot", str(snapshot_s), how, "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert env.cli("run", "--until-caught-up").returncode == 0

    # the late topic's dead letters are in once, whichever way main went back to S
    assert env.counts() == (400 - env.bad + 300 - late_bad, env.bad + late_bad)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_pattern_that_matches_nothing_reads_nothing_and_says_so(make_env: MakeEnv) -> None:
    env = make_env(partitions=1)
    _by_pattern(env, f"{env.topic}_none_.*")
    env.produce(10)

    result = env.cli("run", "--json")

    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["status"] for line in result.stdout.splitlines()] == ["empty"]
    assert f"no topic on {env.bootstrap} matches topics_pattern" in result.stderr


# --- tables: routing by topic --------------------------------------------------------------------


def test_three_topics_into_two_tables_by_map_and_pattern(routed: Routed) -> None:
    routed.produce("a1", 1_200, bad_every=37)
    routed.produce("a2", 800, bad_every=41)
    routed.produce("b", 700, bad_every=29)

    first = routed.cli("run", "--until-caught-up", "--json")

    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert {line["table"] for line in lines} == set(routed.tables), (first.stdout, first.stderr)
    routed.exact()
    # a topic created later that the pattern matches is read by the next run, from its start
    routed.topics["b_late"] = f"{routed.topics['b']}_late"
    create_topic(routed.env.bootstrap, routed.topics["b_late"], 1)
    routed.produce("b_late", 300, bad_every=23, partitions=1)
    routed.produce("a2", 100)
    assert routed.cli("run", "--until-caught-up").returncode == 0
    routed.exact()

    statuses = [json.loads(line) for line in routed.cli("status", "--json").stdout.splitlines()]
    assert [s["table"] for s in statuses] == list(routed.tables)
    assert {p["topic"] for p in statuses[1]["partitions"]} == {routed.topics["b"], routed.topics["b_late"]}
    assert all(s["lag"] == 0 for s in statuses)
    history = [json.loads(line) for line in routed.cli("history", "--json").stdout.splitlines()]
    assert [sum(b["records"] + b["dead_letters"] for b in h["entries"]) for h in history] == [2_100, 1_000]
    one = routed.cli("status", "--table", routed.tables[1], "--json")
    assert json.loads(one.stdout)["batch"] == 2
    human = routed.cli("verify")
    assert human.returncode == 0 and "2 of 2 tables verified: ok" in human.stdout
    reset = routed.cli("reset", "--to-earliest", "--reason", "r")
    assert reset.returncode == 78 and "name one with --table" in reset.stderr
    check = routed.cli("check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert [json.loads(line)["table"] for line in check.stdout.splitlines()] == list(routed.tables)
    maintained = routed.cli("maintain", "--json")
    assert maintained.returncode == 0, maintained.stderr
    assert len(maintained.stdout.splitlines()) == 2
    routed.exact()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_topic_moved_to_another_table_is_refused_until_reset_where_the_first_stopped(routed: Routed) -> None:
    routed.produce("a1", 300)
    routed.produce("b", 500, bad_every=9)
    assert routed.cli("run", "--until-caught-up").returncode == 0
    data = yaml.safe_load(routed.path.read_text())
    data["tables"][0]["topics"].append(routed.topics["b"])  # listed: it leaves the pattern's table
    routed.path.write_text(yaml.safe_dump(data))
    routed.produce("b", 200, bad_every=9)

    refused = routed.cli("run", "--until-caught-up")

    assert refused.returncode == 65, refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"now feed {routed.tables[0]}, but {routed.tables[1]} has read them" in said
    where = said.split("--to-offsets ")[1].split(" ")[0]
    assert where == f"{routed.topics['b']}:0=250,{routed.topics['b']}:1=250"
    reset = routed.cli("reset", "--table", routed.tables[0], "--to-offsets", where, "--reason", "moved")
    assert reset.returncode == 0, reset.stderr
    assert routed.cli("run", "--until-caught-up").returncode == 0
    # b's first 500 records stay in the table that read them, the 200 after it in the other: once each
    orders, refunds = (sum(routed.counts(t)) for t in routed.tables)
    assert (orders, refunds) == (300 + 200, 500)
    result = routed.cli("verify", "--json")
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_sigterm_stops_a_run_of_several_tables_with_exit_143(routed: Routed) -> None:
    routed.produce("a1", 300)
    routed.produce("b", 300)
    loop = subprocess.Popen(
        [sys.executable, "-m", "ingest", "run", "--every", "2s", "--json", "-c", str(routed.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert loop.stdout is not None
    assert json.loads(loop.stdout.readline())["table"] == routed.tables[0]  # the first table's batch is in

    loop.send_signal(signal.SIGTERM)
    _, stderr = loop.communicate(timeout=60)

    assert loop.returncode == 143, stderr
    assert "stopped by SIGTERM between batches" in " ".join(stderr.split())
    assert routed.cli("run", "--until-caught-up").returncode == 0
    routed.exact()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
@pytest.mark.parametrize("nth", [2])  # (the first table's batch crashes as a config of one table's: test_crash)
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_step_of_the_second_table_then_rerun(routed: Routed, point: str, nth: int) -> None:
    routed.produce("a1", 900, bad_every=11)
    routed.produce("a2", 600, bad_every=13)
    routed.produce("b", 700, bad_every=7)

    killed = routed.cli("run", env={"INGEST_FAILPOINT": f"{point}#{nth}"})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the first table's batch is in (or not) as a crash at that point leaves it; the second's not yet
    rows = routed.counts(routed.tables[0])[0]
    assert rows > 0 if (nth == 2 or point == "after-commit") else rows == 0
    assert routed.counts(routed.tables[1])[0] == 0 or (nth == 2 and point in ("between-commits", "after-commit"))
    rerun = routed.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    routed.exact()


@pytest.mark.catalog_race
def test_three_racing_copies_with_different_caps(routed: Routed, catalog_kind: str) -> None:
    routed.produce("a1", 2_000, bad_every=17)
    routed.produce("a2", 1_500, bad_every=19)
    routed.produce("b", 2_500, bad_every=23)
    paths = [routed.with_cap(cap) for cap in (400, 700, 1_100)]

    race(paths)

    final = routed.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    routed.exact()
