"""What a user installs: the wheel `make dist` builds, installed into a fresh virtualenv, runs
`ingest --version`, `ingest demo`, and `ingest init` then `ingest check` from an empty directory
(the example configs, the starter and the config schema travel in the wheel; nothing imports the
repository's tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration


def _run(
    *args: str | Path, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_wheel_installed_in_a_fresh_virtualenv_runs_the_demo_and_starts_a_pipeline_from_an_empty_directory(
    tmp_path: Path,
) -> None:
    built = _run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", REPO, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("lakehouse_ingest-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"ingest/examples/orders.yaml", "ingest/examples/starter.yaml", "ingest/examples/ingest.schema.json"} <= set(
        names
    )
    assert not [n for n in names if n.startswith("tests/")]

    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    installed = _run(
        venv / "bin" / "pip", "install", "--quiet", "-c", REPO / "constraints.txt", f"{wheel}[embedded]", cwd=tmp_path
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    empty = tmp_path / "somewhere"
    empty.mkdir()
    version = _run(venv / "bin" / "ingest", "--version", cwd=empty)
    assert version.returncode == 0 and version.stdout.strip() == "lakehouse-ingest 0.1.0", version
    demo = _run(venv / "bin" / "ingest", "demo", "--records", "2000", cwd=empty)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "verify: ok — 2000 records in Kafka = 2000 rows + dead letters" in demo.stdout
    assert not [line for line in demo.stderr.splitlines() if line.startswith("%")], demo.stderr  # raw librdkafka
    assert (empty / "warehouse" / "catalog.db").is_file()

    init = _run(venv / "bin" / "ingest", "init", "mine", cwd=empty)
    assert init.returncode == 0, init.stdout + init.stderr
    # what init wrote loads; with no broker to reach, check says so: retryable (75), not a config error
    check = _run(
        venv / "bin" / "ingest",
        "check",
        "-c",
        "mine/pipeline.yaml",
        cwd=empty,
        timeout=120,
        env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"},
    )
    assert check.returncode == 75, check.stdout + check.stderr
    assert "cannot reach Kafka at 127.0.0.1:9" in check.stdout + check.stderr
