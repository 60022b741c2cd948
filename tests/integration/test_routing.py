"""Topics chosen by a pattern (``topics_pattern:``), against the real broker and catalogs."""

from __future__ import annotations

import json

import pytest
import yaml

from ingest.kafka.admin import create_topic, produce
from tests.integration.conftest import Env, record

pytestmark = pytest.mark.integration


def _by_pattern(env: Env, pattern: str) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    del data["topics"]
    data["topics_pattern"] = pattern
    env.config_path.write_text(yaml.safe_dump(data))


def _produce(env: Env, topic: str, partitions: int, first: int, count: int, bad_every: int) -> int:
    """Records ``first`` .. ``first + count`` into ``topic``; returns how many are poison."""
    bad = [i % bad_every == bad_every - 1 for i in range(first, first + count)]
    numbered = zip(range(first, first + count), bad, strict=True)
    produce(env.bootstrap, topic, [record(i, partitions, i if is_bad else None) for i, is_bad in numbered])
    return sum(bad)


def test_a_topic_created_mid_run_that_matches_is_read_from_its_earliest_offset(make_env) -> None:
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
    late_bad = _produce(env, late, 3, 0, 900, bad_every=61)  # written before the next run sees the topic
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


def test_a_pattern_that_matches_nothing_reads_nothing_and_says_so(make_env) -> None:
    env = make_env(partitions=1)
    _by_pattern(env, f"{env.topic}_none_.*")
    env.produce(10)

    result = env.cli("run", "--json")

    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["status"] for line in result.stdout.splitlines()] == ["empty"]
    assert f"no topic on {env.bootstrap} matches topics_pattern" in result.stderr
