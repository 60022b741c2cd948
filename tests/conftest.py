"""Suite-wide: say which Kafka broker the integration tests run on, at the top of every run."""

from __future__ import annotations

import pytest


def pytest_report_header(config: pytest.Config) -> str:
    from tests.integration.conftest import broker_choice

    return f"kafka broker: {broker_choice()[1]}"
