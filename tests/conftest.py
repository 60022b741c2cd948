"""Suite-wide: say which Kafka broker and catalogs the integration tests run on and whether the run is
strict, at the top of every run; keep the PostgreSQL variants to the tests whose subject is the
catalog's compare-and-swap; and, in a strict run, fail the run on a skip that is not allowed
(tests/strict.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests import strict


def pytest_report_header(config: pytest.Config) -> list[str]:
    from tests.integration.conftest import CATALOG_KINDS, CHOSEN_CATALOGS, broker_choice

    if CHOSEN_CATALOGS:
        catalogs = f"catalogs: {', '.join(CATALOG_KINDS)} (INGEST_TEST_CATALOGS), or the ones a test names"
    else:
        catalogs = (
            "catalogs: sqlite; sqlite and postgres for tests marked catalog_race; or the ones a test names"
            " (INGEST_TEST_CATALOGS=sqlite,postgres runs every other test on both too)"
        )
    return [f"kafka broker: {broker_choice()[1]}", catalogs, f"run: {strict.describe()}"]


def _names_its_catalogs(item: pytest.Item) -> bool:
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        if "catalog_kind" in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``INGEST_TEST_CATALOGS``, a test that does not name its catalogs runs on PostgreSQL only
    when it is marked ``catalog_race`` (racing copies, kills around a commit, other writers): PostgreSQL's
    row locks are what SQLite's one writer does not exercise. Elsewhere the two SQL catalogs run the same
    pyiceberg code, and the PostgreSQL run of every test cost CI ~10 minutes."""
    from tests.integration.conftest import CHOSEN_CATALOGS

    if CHOSEN_CATALOGS:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and callspec.params.get("catalog_kind") == "postgres"
            and item.get_closest_marker("catalog_race") is None
            and not _names_its_catalogs(item)
        ):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str


#: every skip the session reported (under pytest-xdist, the controller's copy holds the workers' too)
_SKIPS: dict[Skip, None] = {}


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS[Skip(report.nodeid, _reason(report))] = None


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a module skipped whole (importorskip, a module-level skip)
        _SKIPS[Skip(report.nodeid, _reason(report))] = None


def _refused() -> list[Skip]:
    return [skip for skip in _SKIPS if not strict.allowed(skip.reason)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A strict run with a skip that is not allowed fails (pytest-xdist's workers leave it to the controller)."""
    if hasattr(session.config, "workerinput"):
        return
    passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)  # the latter: every module skipped whole
    if strict.strict() and _refused() and session.exitstatus in passing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    refused = _refused()
    if strict.strict():
        terminalreporter.section("strict run: allowed skips")
        for allowed in strict.ALLOWED_SKIPS:
            terminalreporter.line(f"{allowed.pattern}  ({allowed.why})")
        if refused:
            terminalreporter.line("")
            terminalreporter.line(f"{len(refused)} skip(s) not allowed in a strict run, so the run fails:", red=True)
    elif refused:
        terminalreporter.section("skips a strict run (CI) would fail")
    for skip in refused:
        terminalreporter.line(f"{skip.nodeid}: {skip.reason}")
