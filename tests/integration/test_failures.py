"""What a user sees when something is wrong: the message, the exit code, and no data lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Message

from ingest.assembly import open_pipeline
from ingest.engines.local import LocalEngine
from ingest.errors import BrokerUnavailable, ExitCode
from ingest.kafka.admin import create_topic
from ingest.kafka.clients import Clients
from ingest.kafka.embedded import EmbeddedBroker, free_port
from tests.integration.conftest import MakeEnv
from tests.runs import one_batch

from .conftest import POSTGRES_URI, REPO, Env

pytestmark = pytest.mark.integration


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def _write(tmp_path: Path, env: Env, **changes: Any) -> Path:
    data = yaml.safe_load(env.config_path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"topic": ["x"]}, "topic: unknown key"),
        ({"pipeline": None}, "pipeline: required key is missing"),
        ({"schema": [{"name": "a", "type": "varchar"}]}, "unknown Iceberg type 'varchar'"),
        ({"batch": {"max_records": 0}}, "batch.max_records"),
        ({"kafka": {"group.id": "g"}}, "bootstrap.servers"),
        ({"partition_by": ["day(nope)"]}, "'nope', which is not in schema"),
    ],
)
def test_bad_config_names_the_key_and_exits_78(
    make_env: MakeEnv, tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    path = _write(tmp_path, make_env(), **change)
    result = _cli("run", "-c", str(path))
    assert result.returncode == ExitCode.CONFIG
    assert expected in result.stderr


def test_missing_environment_variable(make_env: MakeEnv, tmp_path: Path) -> None:
    path = _write(tmp_path, make_env(), kafka={"bootstrap.servers": "${INGEST_TEST_UNSET_VAR}"})
    result = _cli("status", "-c", str(path))
    assert result.returncode == ExitCode.CONFIG
    assert "INGEST_TEST_UNSET_VAR" in result.stderr


def test_missing_config_file() -> None:
    result = _cli("run", "-c", "/nonexistent/pipeline.yaml")
    assert result.returncode == ExitCode.CONFIG
    assert "cannot read config file" in result.stderr


def test_broker_unreachable_is_retryable(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env(batch={"read_timeout_s": 2})
    path = _write(tmp_path, env, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    result = _cli("run", "-c", str(path))
    assert result.returncode == ExitCode.RETRYABLE
    assert "cannot reach Kafka" in result.stderr


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_broker_refusing_connections_fails_fast_with_one_clear_line(make_env: MakeEnv, tmp_path: Path) -> None:
    # read_timeout_s is for a broker that answers slowly; no broker at all is known within seconds
    # (it took the whole 30 s before, with librdkafka's retry lines on stderr labelled "producer")
    path = _write(tmp_path, make_env(), kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    result = _cli("status", "-c", str(path))
    assert result.returncode == ExitCode.RETRYABLE
    assert "every broker refused the connection" in result.stderr
    assert "rdkafka" not in result.stderr  # librdkafka's own lines only with -v
    verbose = _cli("status", "-c", str(path), "-v", "--log-format", "json")  # after the subcommand, too
    logged = [json.loads(line) for line in verbose.stderr.splitlines() if line.startswith("{")]
    assert logged and all({"time", "level", "logger", "message"} <= set(line) for line in logged)
    assert any(
        line["logger"] == "ingest.kafka.librdkafka" and "Connection refused" in line["message"] for line in logged
    )


@pytest.mark.parametrize("catalog_kind", ["postgres"], indirect=True)
def test_catalog_unreachable_is_retryable(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env()
    catalog = yaml.safe_load(env.config_path.read_text())["catalog"]
    catalog["uri"] = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    result = _cli("run", "-c", str(_write(tmp_path, env, catalog=catalog)))
    assert result.returncode == ExitCode.RETRYABLE
    assert "catalog" in result.stderr


def test_unknown_topic_is_fatal(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env()
    result = _cli("run", "-c", str(_write(tmp_path, env, topics=["no-such-topic-here"])))
    assert result.returncode == ExitCode.FATAL
    assert "does not exist" in result.stderr


class _HangsOnceRecordsCame:
    """A consumer whose broker is stopped (SIGSTOP) the moment a fetch first returned records: the
    batch has read something, and the rest of it hangs. Its first ``consume`` asks for one record,
    so it returns as soon as the first fetch is in, before librdkafka fetches on."""

    def __init__(self, consumer: Consumer, broker_pid: int, read: list[int]) -> None:
        self._consumer, self._broker_pid, self.read = consumer, broker_pid, read

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        messages = self._consumer.consume(num_messages if self.read else 1, timeout)
        records = sum(1 for message in messages if message.error() is None)
        if records and not self.read:
            os.kill(self._broker_pid, signal.SIGSTOP)
        if records or self.read:
            self.read.append(records)
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_broker_hung_mid_batch_then_recovers(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that stops answering once the batch's first fetch returned records fails the batch
    (retryable, nothing committed); the rerun completes it. Each partition's fetches are as small as
    the broker makes them (``max.partition.fetch.bytes``: it still sends a record batch or more)
    and none goes ahead of what is consumed (``queued.min.messages``), so records are still to come
    when it stops (without them the first fetch took the whole batch, which never hung)."""
    with EmbeddedBroker(log_path=tmp_path / "own-broker.log") as broker:
        kafka = {"bootstrap.servers": broker.bootstrap_servers, "max.partition.fetch.bytes": 1}
        kafka["queued.min.messages"] = 1
        env = make_env(batch={"read_timeout_s": 3}, kafka=kafka)
        env.bootstrap = broker.bootstrap_servers
        create_topic(broker.bootstrap_servers, env.topic, env.partitions)
        for _ in range(20):  # each partition's records in 20 record batches or more
            env.produce(100, bad_every=10)
        pipeline = open_pipeline(env.config)
        pid = broker.pid
        assert pid is not None
        real, read = Clients.consumer, list[int]()

        def hanging(self: Clients, sized_for: int | None = None) -> Any:
            return _HangsOnceRecordsCame(real(self, sized_for), pid, read)

        monkeypatch.setattr(Clients, "consumer", hanging)
        try:
            with pytest.raises(BrokerUnavailable) as caught:
                pipeline.run_batch(LocalEngine(pipeline.config, pipeline.rows))
        finally:
            os.kill(pid, signal.SIGCONT)
        monkeypatch.undo()
        assert "no progress from Kafka" in str(caught.value)
        assert read[0] > 0 and sum(read) < 2_000, read  # it had read records, and not all of them
        assert pipeline.ledger() is None  # nothing committed

        assert one_batch(pipeline).status == "committed"
        env.exact()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_batch_of_mostly_dead_letters_stops_before_it_commits_under_max_ratio(make_env: MakeEnv) -> None:
    """300 records whose values drifted: with ``dead_letters.max_ratio`` the run exits 65 saying
    why and commits nothing (the ledger, and so the data's valid-through, stays where it was),
    instead of exiting 0 with 0 rows."""
    env = make_env(partitions=2, dead_letters={"max_ratio": 0.1})
    env.produce(100)
    assert env.cli("run").returncode == 0
    before = open_pipeline(env.config).rows.table.metadata
    env.produce(300, bad_every=1)

    stopped = env.cli("run", "--until-caught-up")

    assert stopped.returncode == 65, stopped.stderr
    said = " ".join(stopped.stderr.split())
    assert "300 of its 300 records (100.0%) are dead letters, over dead_letters.max_ratio 0.1" in said
    assert "Nothing was committed; the records stay in Kafka. The commonest reasons: 60× " in said
    after = open_pipeline(env.config)
    assert len(after.rows.table.metadata.snapshots) == len(before.snapshots)
    assert after.dead.table.current_snapshot() is None
    data = yaml.safe_load(env.config_path.read_text())
    data["dead_letters"] = {"max_ratio": 1.0}  # the operator looked, and lets them be set aside
    env.config_path.write_text(yaml.safe_dump(data))
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (100, 300)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"kafka": {"bootstrap.server": "x"}},
            'kafka: librdkafka refused the configuration: No such configuration property: "bootstrap.server"',
        ),
        (
            {"catalog": {"uri": "sqlite:////nonexistent/dir/catalog.db"}},
            "catalog.uri: the directory /nonexistent/dir of the SQLite catalog does not exist",
        ),
        (
            {"catalog": {"uri": POSTGRES_URI.rsplit("/", 1)[0] + "/no_such_db"}},
            'catalog.uri: the PostgreSQL server refused: database "no_such_db" does not exist',
        ),
        ({"catalog": {"type": "hive"}}, "catalog: Apache Hive support not installed: pip install 'pyiceberg[hive]'"),
        (
            {"partition_by": ["day(order_id)"]},
            "partition_by: 'day(order_id)': day cannot partition order_id, a long column",
        ),
    ],
)
def test_configuration_mistakes_exit_78_naming_the_key_before_any_side_effect(
    make_env: MakeEnv, change: dict[str, Any], says: str
) -> None:
    """Mistakes that cannot heal by themselves are configuration errors (78: an orchestrator does
    not retry them forever), said before anything is created."""
    env = make_env(partitions=1)
    env.produce(5)
    data = yaml.safe_load(env.config_path.read_text())
    for section, values in change.items():
        data[section] = {**data[section], **values} if isinstance(values, dict) else values
    env.config_path.write_text(yaml.safe_dump(data))

    result = env.cli("run")

    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert says in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    if "kafka" in change or "partition_by" in change:  # the catalog was reachable: still, nothing was created in it
        from ingest.iceberg.catalog import connect

        assert connect(data["catalog"]).list_namespaces() == []


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_changed_partition_by_on_an_existing_table_is_refused_not_ignored(make_env: MakeEnv) -> None:
    env = make_env(partitions=1, partition_by=["day(created_at)"])
    env.produce(10)
    assert env.cli("run").returncode == 0
    data = yaml.safe_load(env.config_path.read_text())
    data["partition_by"] = ["bucket(8, order_id)"]
    env.config_path.write_text(yaml.safe_dump(data))
    env.produce(10)

    result = env.cli("run")

    assert result.returncode == ExitCode.FATAL, result.stderr
    said = " ".join(result.stderr.split())
    assert "the table is partitioned by [day(created_at)], the config says [bucket[8](order_id)]" in said
    from ingest.iceberg.catalog import connect

    assert connect(data["catalog"]).load_table(env.config.table).scan().to_arrow().num_rows == 10


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize(
    ("kafka", "says"),
    [
        ({"fetch.max.byte": 5}, 'No such configuration property: "fetch.max.byte"'),
        ({"fetch.max.bytes": 500_000}, "`fetch.max.bytes` must be >= `message.max.bytes`"),
    ],
)
def test_check_refuses_the_consumer_properties_run_refuses_with_the_same_message(
    make_env: MakeEnv, kafka: dict[str, Any], says: str
) -> None:
    """`check` builds the consumer `run` reads with: a property librdkafka refuses there (a typo, a
    limit below another) fails both, with one message, instead of `ok kafka` then exit 78."""
    env = make_env(partitions=1)
    env.produce(5)
    data = yaml.safe_load(env.config_path.read_text())
    data["kafka"] |= kafka
    env.config_path.write_text(yaml.safe_dump(data))

    checked, ran = env.cli("check"), env.cli("run")

    assert (checked.returncode, ran.returncode) == (ExitCode.CONFIG, ExitCode.CONFIG), checked.stdout + ran.stderr
    message = "kafka: librdkafka refused the configuration: " + ("Failed to create consumer: " if "`" in says else "")
    message += says + ". Fix `kafka:` in the config"
    assert f"failed kafka: {message}" in " ".join(checked.stdout.split())
    assert f"(config, ConfigError): {message}" in " ".join(ran.stderr.split())


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"catalog": {"uri": "sqllite:///catalog.db"}},
            "catalog.uri: 'sqllite' is not a database SQLAlchemy knows "
            "(Can't load plugin: sqlalchemy.dialects:sqllite)",
        ),
        (
            {"catalog": {"type": "sqll"}},
            "catalog.type: 'sqll' is not a catalog type pyiceberg knows; one of: rest, hive, glue, dynamodb, sql, "
            "in-memory, bigquery",
        ),
        (
            {"catalog": {"uri": "sqlite:///{tmp}/notes.db"}},
            "catalog.uri: {tmp}/notes.db is not a SQLite database (point the uri at the catalog's database file",
        ),
        (
            {"kafka": {"bootstrap.servers": "kafka-1.invalid:9092,kafka-2.invalid:9092"}},
            "kafka.bootstrap.servers: no host of 'kafka-1.invalid:9092,kafka-2.invalid:9092' exists: "
            "'kafka-1.invalid' (Name or service not known), 'kafka-2.invalid' (Name or service not known). "
            "Fix the host names in `kafka:`",
        ),
    ],
)
def test_a_misspelt_catalog_scheme_a_file_that_is_no_database_and_an_unknown_host_are_config_errors(
    make_env: MakeEnv, tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    """They exited 75 (CatalogUnavailable, BrokerUnavailable: "every broker refused the connection"),
    which an orchestrator retries for ever; a broker that refuses connections stays 75
    (test_broker_unreachable_is_retryable)."""
    (tmp_path / "notes.db").write_text("not a database\n")
    env = make_env(partitions=1)
    env.produce(5)
    data = yaml.safe_load(env.config_path.read_text())
    for section, values in change.items():
        values = {k: v.replace("{tmp}", str(tmp_path)) for k, v in values.items()}
        data[section] = {**data[section], **values}
    env.config_path.write_text(yaml.safe_dump(data))
    says = says.replace("{tmp}", str(tmp_path))

    ran, checked = env.cli("run"), env.cli("check")

    # (the terminal folds a long path anywhere: compared without whitespace)
    assert ran.returncode == ExitCode.CONFIG, ran.stderr
    assert "".join(says.split()) in "".join(ran.stderr.split()), ran.stderr
    assert checked.returncode == ExitCode.CONFIG, checked.stdout
    assert "".join(says.split()) in "".join(checked.stdout.split()), checked.stdout


def test_a_config_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path: Path) -> None:
    """It crashed with exit 1 and a 60-line traceback (UnicodeDecodeError)."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("pipeline: orders\n# café\n".encode("latin-1"))

    result = _cli("run", "-c", str(path))

    assert result.returncode == ExitCode.CONFIG, result.stderr
    said = " ".join(result.stderr.split())
    assert (
        f"{path} is not UTF-8 text: byte 0xe9 at offset 22 (line 2, column 6) is not valid UTF-8. Save the file as "
        "UTF-8" in said
    )
    assert "Traceback" not in result.stderr


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    """PyYAML named "<unicode string>" instead of the file."""
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: orders\nkafka: {bootstrap.servers: localhost:9092\ntopics: [orders]\n")

    result = _cli("check", "-c", str(path))

    assert result.returncode == ExitCode.CONFIG, result.stderr
    said = " ".join(result.stderr.split())
    assert f"{path} is not valid YAML (line 3, column 7): while parsing a flow mapping" in said
    assert f"expected ',' or '}}', but got ':' in \"{path}\", line 3, column 7" in said
    assert "<unicode string>" not in said
