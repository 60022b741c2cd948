"""Crash safety with real processes: SIGKILL `ingest run` anywhere, rerun, nothing lost or doubled."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest

from ingest.failpoints import POINTS
from tests.integration.conftest import Env, MakeEnv, race

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.catalog_race]


def _snapshots(env: Env, table: str) -> int:
    from ingest.assembly import open_pipeline

    pipeline = open_pipeline(env.config)
    chosen = pipeline.rows if table == "rows" else pipeline.dead
    return len(chosen.table.metadata.snapshots)


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_step_then_rerun(make_env: MakeEnv, point: str) -> None:
    env = make_env()
    env.produce(3_000, bad_every=11)

    killed = env.cli("run", env={"INGEST_FAILPOINT": point})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # what a reader sees right after the crash: the rows commit decides, the dead letters follow
    committed_rows = point in ("between-commits", "after-commit")
    committed_dead = point == "after-commit"
    assert _snapshots(env, "rows") == int(committed_rows)
    assert _snapshots(env, "dead") == int(committed_dead)

    rerun = env.cli("run", "--until-caught-up", "--json")
    assert rerun.returncode == 0, rerun.stderr
    env.exact()


def _committed(env: Env) -> int:
    """Offsets the rows table's ledger has passed, summed over partitions (0: none yet)."""
    from ingest.assembly import open_pipeline

    found = open_pipeline(env.config).ledger()
    return sum(found.ledger.offsets.values()) if found is not None else 0


def test_sigkill_at_random_moments(make_env: MakeEnv) -> None:
    """Six runs, each SIGKILLed at a random moment after it reported its first batch: so each kill
    lands while the run is busy with a later batch (reading, writing or committing it), and each
    run is shown to have committed something and to have had more to do when it died."""
    env = make_env(batch={"max_records": 700, "chunk_records": 300})
    rng = random.Random(20261202)
    for kill in range(6):
        env.produce(2_000, bad_every=13)
        before = _committed(env)
        process = env.popen("run", "--until-caught-up", "--json")
        first = process.stdout.readline() if process.stdout is not None else ""
        assert first, process.communicate()[1]
        time.sleep(rng.uniform(0.0, max(0.05, json.loads(first)["seconds"])))  # inside the next batch or two
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
        assert process.returncode == -signal.SIGKILL, f"kill {kill}: the run ended before it: {stderr}"
        assert before < _committed(env) < env.produced, f"kill {kill} did not land mid-run"
    final = env.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    env.exact()


@pytest.mark.parametrize("copies", [2, 4])
def test_concurrent_copies_of_one_pipeline(make_env: MakeEnv, catalog_kind: str, copies: int) -> None:
    if catalog_kind.startswith("glue"):
        pytest.skip("moto's Glue ignores UpdateTable's VersionId: no compare-and-swap for copies to race on")
    env = make_env(batch={"max_records": 500})
    env.produce(4_000, bad_every=17)

    # every copy finishes or stops with a retryable error (fenced too often, catalog busy), and the
    # first one's first batch meets another copy's commit
    race([env.config_path] * copies)

    final = env.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    env.exact()
