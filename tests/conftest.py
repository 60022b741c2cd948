"""Suite-wide: say which Kafka broker and catalogs the integration tests run on, at the top of every run,
and keep the PostgreSQL variants to the tests whose subject is the catalog's compare-and-swap."""

from __future__ import annotations

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    from tests.integration.conftest import CATALOG_KINDS, CHOSEN_CATALOGS, broker_choice

    if CHOSEN_CATALOGS:
        catalogs = f"catalogs: {', '.join(CATALOG_KINDS)} (INGEST_TEST_CATALOGS), or the ones a test names"
    else:
        catalogs = (
            "catalogs: sqlite; sqlite and postgres for tests marked catalog_race; or the ones a test names"
            " (INGEST_TEST_CATALOGS=sqlite,postgres runs every other test on both too)"
        )
    return [f"kafka broker: {broker_choice()[1]}", catalogs]


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
