"""A REST catalog's unknown commit outcomes, on the wire: Iceberg's REST catalog server behind a
fault-injecting proxy that forwards a commit and loses, fails or holds its answer, or fails it
without forwarding. With and without a SIGKILL at that moment: no duplicate, no gap, ``verify``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Env, MakeEnv
from tests.services.faultproxy import Fault, FaultProxy
from tests.services.iceberg_rest import RestCatalog

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["rest"], indirect=True)]

#: the client's request timeout (``commit.request_timeout_s``), and how long ``hold`` holds: past it
TIMEOUT_S, HOLD_S = 10, 120

#: the faults, by what the client sees: no answer, a 5xx after the catalog applied the commit, no
#: answer within the timeout, a 5xx for a commit the catalog never saw
FAULTS: list[Fault] = ["drop", "error", "hold", "refuse"]


@pytest.fixture
def proxy(rest_local: RestCatalog) -> Iterator[FaultProxy]:
    with FaultProxy(rest_local.uri) as running:
        yield running


def _env(make_env: MakeEnv, proxy: FaultProxy) -> Env:
    """A pipeline whose catalog is the REST server behind ``proxy``, its tables made by a first run."""
    env = make_env(
        catalog={"name": "lake_rest", "type": "rest", "uri": proxy.uri},
        commit={"request_timeout_s": TIMEOUT_S},
    )
    env.produce(40, bad_every=20)
    assert env.cli("run").returncode == 0
    return env


@pytest.mark.parametrize("fault", FAULTS)
def test_a_rows_commit_with_an_unknown_outcome_lands_once(make_env: MakeEnv, proxy: FaultProxy, fault: Fault) -> None:
    env = _env(make_env, proxy)
    env.produce(800, bad_every=50)
    plan = proxy.arm(fault, table="orders", hold_s=HOLD_S)

    result = env.cli("run", "--json")

    assert result.returncode == 0, result.stderr
    assert plan.faulted == 1
    if fault == "hold":  # the client gave up on its own: the proxy never closed the connection
        assert "Read timed out" in result.stderr, result.stderr
    assert env.counts() == (env.produced - env.bad, env.bad)
    env.verify()
    retries = json.loads(result.stdout.splitlines()[-1])["commit_retries"]
    assert retries["unknown"] >= 1, retries  # settled by reading the ledger again


@pytest.mark.parametrize("fault", FAULTS)
def test_sigkill_once_the_commit_met_its_fault_then_rerun(make_env: MakeEnv, proxy: FaultProxy, fault: Fault) -> None:
    env = _env(make_env, proxy)
    env.produce(800, bad_every=50)
    plan = proxy.arm(fault, table="orders", hold_s=HOLD_S)
    process = env.popen("run")
    try:
        assert plan.met.wait(120), "no commit reached the proxy"
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    # an error or a refusal is answered at once: the run may, rarely, settle before the kill lands
    assert process.returncode == -signal.SIGKILL or (fault in ("error", "refuse") and process.returncode == 0)
    proxy.disarm()

    again = env.cli("run")

    assert again.returncode == 0, again.stderr
    assert env.counts() == (env.produced - env.bad, env.bad)
    env.verify()


def test_a_dead_letter_commit_with_a_lost_answer_lands_once(make_env: MakeEnv, proxy: FaultProxy) -> None:
    env = _env(make_env, proxy)
    env.produce(800, bad_every=50)
    plan = proxy.arm("drop", table="orders_dead_letter")

    assert env.cli("run").returncode == 0
    assert plan.faulted == 1
    assert env.counts() == (env.produced - env.bad, env.bad)
    env.verify()


def test_a_catalog_failing_every_commit_stops_the_run_and_the_next_lands_everything(
    make_env: MakeEnv, proxy: FaultProxy
) -> None:
    env = _env(make_env, proxy)
    env.produce(800, bad_every=50)
    plan = proxy.arm("refuse", table="orders", count=None, status=503)

    failed = env.cli("run")

    assert failed.returncode == 75, failed.stderr  # retryable: the scheduler runs it again
    assert plan.faulted >= 2 and "run again" in failed.stderr.lower()
    proxy.disarm()
    assert env.cli("run").returncode == 0
    assert env.counts() == (env.produced - env.bad, env.bad)
    env.verify()
