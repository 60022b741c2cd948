"""How OpenLineage names what a run reads and writes, and when it sends anything (:mod:`ingest.lineage`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.config import parse
from ingest.config.lineage_spec import configured
from ingest.lineage import job_name, kafka_namespace, location_naming

BASE = {
    "pipeline": "orders",
    "kafka": {"bootstrap.servers": "broker-1.internal:9093,broker-2.internal:9093"},
    "topics": ["orders"],
    "catalog": {"name": "lake", "type": "sql", "uri": "sqlite:///x.db"},
    "table": "analytics.orders",
    "schema": [{"name": "id", "type": "long"}],
}


def test_kafka_is_named_by_its_first_bootstrap_server() -> None:
    assert kafka_namespace(parse(BASE)) == "kafka://broker-1.internal:9093"
    plain = parse({**BASE, "kafka": {"bootstrap.servers": "SASL_SSL://kafka"}})
    assert kafka_namespace(plain) == "kafka://kafka:9092"


@pytest.mark.parametrize(
    ("location", "named"),
    [
        ("s3://lake/warehouse/analytics/orders", ("s3://lake", "warehouse/analytics/orders")),
        ("s3a://lake/w/t", ("s3://lake", "w/t")),
        ("file:///srv/warehouse/analytics/orders", ("file", "/srv/warehouse/analytics/orders")),
        ("/srv/warehouse/t", ("file", "/srv/warehouse/t")),
        ("gs://bucket/w/t", ("gs://bucket", "w/t")),
        ("hdfs://namenode:8020/w/t", ("hdfs://namenode:8020", "/w/t")),
    ],
)
def test_a_table_is_named_by_its_location(location: str, named: tuple[str, str]) -> None:
    assert location_naming(location) == named


def test_a_table_of_several_is_a_job_of_its_own() -> None:
    assert job_name(parse(BASE)) == "orders"
    tables = {k: v for k, v in BASE.items() if k not in ("topics", "table", "schema")}
    entries = [
        {"table": "analytics.orders", "topics": ["orders"], "schema": BASE["schema"]},
        {"table": "analytics.refunds", "topics": ["refunds"], "schema": BASE["schema"]},
    ]
    refunds = parse({**tables, "tables": entries}, table="analytics.refunds")
    assert job_name(refunds) == "orders.analytics.refunds"


def test_nothing_is_sent_without_a_destination(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in [k for k in os.environ if k.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not configured(None)
    with_block = parse({**BASE, "lineage": {"url": "http://marquez:5000"}})
    assert configured(with_block.lineage)
    monkeypatch.setenv("OPENLINEAGE_URL", "http://marquez:5000")
    assert configured(None)
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert not configured(with_block.lineage)
    monkeypatch.delenv("OPENLINEAGE_DISABLED")
    monkeypatch.delenv("OPENLINEAGE_URL")
    (tmp_path / "openlineage.yml").write_text("transport: {type: console}\n")
    assert configured(None)


def test_the_block_takes_one_destination() -> None:
    from ingest.errors import ConfigError

    with pytest.raises(ConfigError, match="give `url`"):
        parse({**BASE, "lineage": {"namespace": "prod"}})


def test_a_run_without_a_destination_imports_no_openlineage_client() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ingest.runner import _lineage\n"
        "from ingest.config import parse\n"
        f"config = parse({BASE!r})\n"
        "class Opened: pass\n"
        "opened = Opened(); opened.config = config\n"
        "assert _lineage(opened, None) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('openlineage')))\n"
    )
    environment = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OPENLINEAGE")}
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"
