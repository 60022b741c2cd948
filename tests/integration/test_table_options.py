"""``table_properties`` and ``sort_by``: set on the table a run creates, checked on every open."""

from __future__ import annotations

from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
import yaml

from ingest.assembly import open_pipeline
from ingest.config import load
from ingest.errors import ExitCode
from ingest.intents import Append
from ingest.progress import Advanced
from tests.integration.conftest import Env, MakeEnv

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)]

PROPERTIES = {"write.parquet.compression-codec": "zstd", "write.metadata.previous-versions-max": 7}


def _change(env: Env, **changes: object) -> None:
    data = yaml.safe_load(env.config_path.read_text())
    data.update(changes)
    env.config_path.write_text(yaml.safe_dump(data))


def test_a_created_table_has_them_and_every_file_is_sorted(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, table_properties=PROPERTIES, sort_by=["order_id desc"])
    env.produce(600)

    assert env.cli("run", "--until-caught-up").returncode == 0

    table = open_pipeline(load(env.config_path)).rows.table
    assert {k: table.properties[k] for k in PROPERTIES} == {k: str(v) for k, v in PROPERTIES.items()}
    assert table.properties["commit.retry.num-retries"] == "0"  # the pipeline's own, as before
    (field,) = table.sort_order().fields
    assert (table.schema().find_column_name(field.source_id), str(field.direction).lower()) == ("order_id", "desc")
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(files) > 1
    for path in files:
        parquet = pq.ParquetFile(urlparse(path).path)
        ids = parquet.read(columns=["order_id"])["order_id"].to_pylist()
        assert ids == sorted(ids, reverse=True), path
        assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    env.verify()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"table_properties": {**PROPERTIES, "write.parquet.compression-codec": "snappy"}},
            "write.parquet.compression-codec = 'zstd' (config: 'snappy')",
        ),
        ({"sort_by": ["order_id"]}, "the table is sorted by [order_id desc], the config's sort_by says [order_id]"),
    ],
    ids=["property", "sort-order"],
)
def test_an_existing_table_that_differs_is_refused_before_anything_is_read(
    make_env: MakeEnv, change: dict[str, object], said: str
) -> None:
    env = make_env(table_properties=PROPERTIES, sort_by=["order_id desc"])
    env.produce(50)
    assert env.cli("run").returncode == 0
    original = env.config_path.read_text()
    _change(env, **change)
    env.produce(50)

    checked, ran = env.cli("check"), env.cli("run")

    assert checked.returncode == ran.returncode == ExitCode.FATAL
    for output in (checked.stdout, ran.stderr):
        assert said in " ".join(output.split())  # as rich wraps it
        assert "ALTER TABLE" in output
    env.config_path.write_text(original)
    assert env.counts() == (50, 0)  # the second 50 were not read


def test_sort_by_a_column_the_schema_lacks_is_a_config_error(make_env: MakeEnv) -> None:
    env = make_env(sort_by=["nope desc"])
    result = env.cli("run")
    assert result.returncode == ExitCode.CONFIG
    assert "sort_by: 'nope desc' refers to 'nope', which is not in schema" in result.stderr


@pytest.mark.parametrize("key_format", [None, "string"])
def test_headers_true_keeps_each_records_headers_in_a_map_column(make_env: MakeEnv, key_format: str | None) -> None:
    from ingest.kafka.admin import produce

    env = make_env(partitions=1, headers=True)
    if key_format:
        _change(env, topics=[{"name": env.topic, "key_format": key_format}])
    value = b'{"order_id": %d, "amount": "1.25", "created_at": "2026-11-01T10:00:00Z"}'
    produce(
        env.bootstrap,
        env.topic,
        [
            (0, b"k1", value % 1, [("trace", b"t-1"), ("origin", b"eu")]),
            (0, b"k2", value % 2, [("retry", b"1"), ("retry", b"2")]),  # a repeated key: its last value
            (0, b"k3", value % 3, None),
            # a header without a value, which Kafka takes and produce()'s type hint leaves out
            (0, b"k4", value % 4, [("empty", None)]),
            (0, b"k5", b"{not json", [("trace", b"t-5")]),  # a dead letter keeps them as they came
        ],
    )

    assert env.cli("run").returncode == 0

    pipeline = open_pipeline(load(env.config_path))
    rows = pipeline.rows.table.scan(selected_fields=("order_id", "_kafka_headers")).to_arrow().sort_by("order_id")
    assert rows["_kafka_headers"].to_pylist() == [
        [("trace", b"t-1"), ("origin", b"eu")],
        [("retry", b"2")],
        [],
        [("empty", None)],
    ]
    dead = pipeline.dead.table.scan(selected_fields=("headers",)).to_arrow()
    assert dead["headers"].to_pylist() == [[{"key": "trace", "value": b"t-5"}]]
    assert str(pipeline.rows.table.schema().find_field("_kafka_headers").field_type) == "map<string, binary>"


def test_partitioning_evolves_only_when_asked_and_new_data_follows_it(make_env: MakeEnv) -> None:
    import json

    env = make_env(partitions=2)  # partition_by: day(created_at)
    env.produce(60)
    assert env.cli("run").returncode == 0
    _change(env, partition_by=["day(created_at)", "bucket(4, order_id)"])
    env.produce(40)

    refused = env.cli("run")
    assert refused.returncode == ExitCode.FATAL
    assert "ingest evolve-partitioning" in " ".join(refused.stderr.split())

    planned = json.loads(env.cli("evolve-partitioning", "--dry-run", "--json").stdout)
    assert planned == {
        "pipeline": "orders",
        "table": planned["table"],
        "status": "dry-run",
        "before": ["day(created_at)"],
        "after": ["day(created_at)", "bucket[4](order_id)"],
    }
    assert env.cli("run").returncode == ExitCode.FATAL  # the dry run changed nothing

    evolved = json.loads(env.cli("evolve-partitioning", "--json").stdout)
    again = json.loads(env.cli("evolve-partitioning", "--json").stdout)
    assert (evolved["status"], again["status"]) == ("evolved", "unchanged")

    assert env.cli("run", "--until-caught-up").returncode == 0
    table = open_pipeline(load(env.config_path)).rows.table
    specs = {task.file.spec_id for task in table.scan().plan_files()}
    assert len(specs) == 2  # the files written before keep their spec; the new ones follow the new
    assert env.counts() == (100, 0)
    env.verify()


def test_a_batch_whose_files_predate_a_partition_evolution_is_not_committed_under_the_new_spec(
    make_env: MakeEnv,
) -> None:
    """A batch writes its files, the spec evolves and another writer commits before the batch
    does: its commit, observing again, finds the table partitioned otherwise than its files. It
    commits nothing (SchemaMoved, retryable); the next run writes the records under the new spec."""
    from collections.abc import Sequence

    from ingest.core.plan import Batch
    from ingest.engines.local import LocalEngine
    from ingest.errors import SchemaMoved
    from ingest.ports import Produced
    from ingest.records import Declared

    env = make_env(partitions=1)
    env.produce(30)
    assert env.cli("run").returncode == 0
    env.produce(30)
    pipeline = open_pipeline(load(env.config_path))

    class Evolving(LocalEngine):
        def produce(self, batch: Batch, fields: Sequence[Declared], advanced: Advanced | None = None) -> Produced:
            produced = super().produce(batch, fields, advanced)  # files under day(created_at)
            _change(env, partition_by=["day(created_at)", "bucket(4, order_id)"])
            assert env.cli("evolve-partitioning").returncode == 0
            other = open_pipeline(load(env.config_path)).rows
            other.commit(Append([], {"note": "another writer"}))  # the head moves: the batch must observe again
            return produced

    with pytest.raises(SchemaMoved, match="partition spec changed"):
        pipeline.run_batch(Evolving(pipeline.config, pipeline.rows))

    assert env.counts() == (30, 0)
    assert env.cli("run", "--until-caught-up").returncode == 0
    table = open_pipeline(load(env.config_path)).rows.table
    newest = {task.file.spec_id for task in table.scan().plan_files() if task.file.record_count}
    assert len(newest) == 2 and env.counts() == (60, 0)
    env.verify()
