"""Without the Spark extra, ``--engine spark`` is a configuration error that names the pip command.

Runs whether or not pyspark is installed: the child process hides it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ingest.errors import ExitCode
from tests.integration.conftest import REPO, MakeEnv

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def catalog_kind() -> str:
    return "sqlite"  # the engine is chosen before any catalog work: one catalog is enough


WITHOUT_PYSPARK = "import sys; sys.modules['pyspark'] = None; from ingest.cli import main; main()"


def test_engine_spark_without_pyspark_says_what_to_install(make_env: MakeEnv) -> None:
    env = make_env()
    env.produce(10)

    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK, "run", "--engine", "spark", "-c", str(env.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )

    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert "pip install 'lakehouse-ingest[spark]'" in result.stderr
