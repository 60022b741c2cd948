"""Strict runs: where a real component is missing, CI fails instead of skipping or falling back.

A run is strict when ``INGEST_TEST_STRICT`` says so (``1`` or ``0``), else when ``CI`` is set and not
``false`` or ``0`` (CI sets ``CI=true``; ``.ci/run`` does too). In a strict run:

* every place the suite would skip for want of a component (Iceberg's REST catalog server and Spark
  runtime, a Spark standalone cluster, the Pushgateway) calls :func:`missing`, which fails the test
  with the reason instead;
* the integration suite does not fall back to tansu where Apache Kafka cannot run: the tests that
  need a broker fail, saying why (``tests/integration/conftest.py``);
* a skip whose reason matches none of :data:`ALLOWED_SKIPS` fails the run when the session ends
  (``tests/conftest.py``), which prints the list.

A run that is not strict (a developer's) skips or falls back as before and says so: in the lines at
the top of the run, in each skip's reason, and at the end, in the skips CI would refuse.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NoReturn

import pytest

STRICT_VARIABLE = "INGEST_TEST_STRICT"
_NO = ("", "0", "false", "no")


def strict() -> bool:
    """Whether a missing component fails the run (see the module's docstring)."""
    explicit = os.environ.get(STRICT_VARIABLE)
    if explicit is not None and explicit.strip():
        return explicit.strip().lower() not in _NO
    return os.environ.get("CI", "").strip().lower() not in _NO


def describe() -> str:
    """One line for the top of a run: strict or not, and why."""
    explicit = os.environ.get(STRICT_VARIABLE, "").strip()
    if strict():
        source = f"{STRICT_VARIABLE}={explicit}" if explicit else f"CI={os.environ.get('CI')}"
        return f"strict ({source}): a missing component fails; only the allowed skips may remain"
    return f"not strict: a missing component skips or falls back to tansu ({STRICT_VARIABLE}=1 or CI=true: fails)"


def missing(reason: str) -> NoReturn:
    """Skip the test for want of a component, or, in a strict run, fail it with the same reason."""
    if strict():
        pytest.fail(f"{reason} (strict run: a missing component fails, it is not skipped)", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class AllowedSkip:
    """A skip a strict run accepts: ``pattern`` is searched for in the skip's reason."""

    pattern: str
    why: str

    def matches(self, reason: str) -> bool:
        return re.search(self.pattern, reason) is not None


#: the only skips a strict run accepts: each is a choice the run made, or a limit of a test server
ALLOWED_SKIPS = (
    AllowedSkip(
        r"^(needs|starts its own) Apache Kafka: embedded tansu \(INGEST_TEST_BROKER=tansu\)$",
        "the run chose tansu (INGEST_TEST_BROKER=tansu: make test's smoke run of the demo's broker)",
    ),
    AllowedSkip(
        r"^starts its own Apache Kafka: external Kafka at ",
        "KAFKA_BOOTSTRAP_SERVERS names a cluster the test cannot kill or reconfigure",
    ),
    AllowedSkip(
        r"^moto's Glue ignores UpdateTable's VersionId",
        "INGEST_TEST_CATALOGS includes glue+s3, and moto's Glue has no compare-and-swap to race on",
    ),
)


def allowed(reason: str) -> bool:
    return any(skip.matches(reason) for skip in ALLOWED_SKIPS)
