"""Real components for the integration suite: the broker process, SQLite/PostgreSQL catalogs, and
an S3 server (moto) for the warehouse.

The broker is Apache Kafka (from Maven Central, KRaft, one node) started on free ports for the
session, an external Kafka when ``KAFKA_BOOTSTRAP_SERVERS`` is set, or the embedded tansu with
``INGEST_TEST_BROKER=tansu`` (and as a fallback, with a warning, where Apache Kafka cannot run; a
strict run, as in CI, fails instead: tests/strict.py).
Every test gets its own topic, namespace and warehouse. ``catalog_kind`` names the catalog and,
after a ``+``, the warehouse's storage: ``sqlite`` and ``postgres`` keep files on the local disk,
``sqlite+s3`` keeps data and metadata in a bucket of the session's S3 server; ``rest`` and
``rest+s3`` talk to Iceberg's REST catalog server (Maven Central), backed by a JDBC store;
``glue+s3`` is pyiceberg's AWS Glue catalog against the S3 server's Glue endpoint.
Tests that do not choose their catalogs run on ``INGEST_TEST_CATALOGS`` (comma-separated kinds);
without it, on ``sqlite``, and on ``sqlite,postgres`` when marked ``catalog_race`` (tests/conftest.py).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from ingest import config as config_module
from ingest.config import PipelineConfig
from ingest.kafka.admin import create_topic, produce
from ingest.kafka.embedded import EmbeddedBroker
from tests import strict
from tests.content import Log, Sent, assert_holds
from tests.services import kafka as kafka_service
from tests.services.apicurio import Apicurio, RegistryUnavailable
from tests.services.iceberg_rest import RestCatalog, RestUnavailable
from tests.services.iceberg_rest import unavailable as rest_unavailable
from tests.services.moto import S3Server, S3Unavailable

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot

POSTGRES_URI = os.environ.get("INGEST_TEST_POSTGRES_URI", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parents[2]

SCHEMA: list[dict[str, Any]] = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "created_at", "type": "timestamptz"},
]


BrokerKind = Literal["external", "kafka", "tansu", "missing"]

#: a record to produce: ``(partition, key, value, headers)``, as :meth:`Env.send` and
#: ``ingest.kafka.admin.produce`` take it
KafkaRecord = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@functools.cache
def _kafka_unavailable() -> str | None:
    """Why Apache Kafka cannot run here (None: it can), resolving it once per process."""
    try:
        kafka_service.resolve()
    except kafka_service.KafkaUnavailable as error:
        return str(error)
    return None


def broker_choice() -> tuple[BrokerKind, str]:
    """Which broker the integration suite runs on, and why: an external cluster
    (``KAFKA_BOOTSTRAP_SERVERS``), Apache Kafka from Maven Central (the default wherever Java and
    Maven are available), the embedded tansu (``INGEST_TEST_BROKER=tansu``, or the fallback where
    Apache Kafka cannot run), or, in a strict run where it cannot, none (``missing``)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external", f"external Kafka at {os.environ['KAFKA_BOOTSTRAP_SERVERS']}"
    if os.environ.get("INGEST_TEST_BROKER", "kafka") == "tansu":
        return "tansu", "embedded tansu (INGEST_TEST_BROKER=tansu)"
    error = _kafka_unavailable()
    if error is None:
        return "kafka", kafka_service.describe()
    if strict.strict():
        return "missing", f"no broker: Apache Kafka cannot run here, and a strict run takes no fallback ({error})"
    return "tansu", f"embedded tansu: FALLBACK, Apache Kafka cannot run here ({error})"


#: a test of what only Apache Kafka (or an external cluster) does: the embedded tansu panics on
#: ``delete_records`` (retention), among others (ENVIRONMENT.md); a strict run allows this skip only
#: where the run chose tansu (tests/strict.py)
needs_apache_kafka = pytest.mark.skipif(
    broker_choice()[0] == "tansu", reason="needs Apache Kafka: " + broker_choice()[1]
)


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    kind, why = broker_choice()
    if kind == "external":
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    elif kind == "kafka":
        with kafka_service.KafkaCluster(tmp_path_factory.mktemp("kafka")) as cluster:
            yield cluster.bootstrap_servers
    elif kind == "missing":
        pytest.fail(why, pytrace=False)
    else:
        if "FALLBACK" in why:
            warnings.warn(why, stacklevel=1)
        with EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log") as broker:
            yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apicurio]:
    """Apicurio Registry (the Confluent Schema Registry API), for the session's registry formats."""
    try:
        server = Apicurio(tmp_path_factory.mktemp("apicurio")).start()
    except RegistryUnavailable as error:
        pytest.fail(f"Apicurio Registry cannot run here: {error}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server, with a bucket ``lake`` the S3 warehouses live in."""
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        server.start().create_bucket("lake")
    except S3Unavailable as error:
        server.stop()
        pytest.fail(f"the S3 server cannot run here: {error}")
    try:
        yield server
    finally:
        server.stop()


def _rest_catalog(directory: Path, warehouse: str, s3: dict[str, str] | None = None) -> RestCatalog:
    """The server started, or the test skipped where Java or Maven is missing (as the Spark interop
    tests do; failed in a strict run) and failed where they are and the server still would not run."""
    why = rest_unavailable()
    if why:
        strict.missing(f"Iceberg's REST catalog server cannot run here: {why}")
    try:
        return RestCatalog(directory, warehouse, s3).start()
    except RestUnavailable as error:
        pytest.fail(f"Iceberg's REST catalog server would not run: {error}")


@pytest.fixture(scope="session")
def rest_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalog]:
    """Iceberg's REST catalog server, its warehouse a local directory."""
    directory = tmp_path_factory.mktemp("rest")
    server = _rest_catalog(directory, (directory / "warehouse").as_uri())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rest_s3(tmp_path_factory: pytest.TempPathFactory, s3: S3Server) -> Iterator[RestCatalog]:
    """Iceberg's REST catalog server, its warehouse in the S3 server's bucket."""
    server = _rest_catalog(tmp_path_factory.mktemp("rest-s3"), "s3://lake/rest", s3.properties())
    yield server
    server.stop()


#: the kinds ``INGEST_TEST_CATALOGS`` chose (None: the default, PostgreSQL kept to ``catalog_race``)
CHOSEN_CATALOGS = os.environ.get("INGEST_TEST_CATALOGS")
CATALOG_KINDS = (CHOSEN_CATALOGS or "sqlite,postgres").split(",")


@pytest.fixture(params=CATALOG_KINDS)
def catalog_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


BAD_VALUES: list[bytes | None] = [b"{not json", b'{"amount": 1}', b'{"order_id": "x"}', b"[1]", None]


def record(i: int, partitions: int, bad: int | None) -> tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]:
    """Record ``i``; ``bad`` picks one of the kinds of poison in BAD_VALUES (None: a good record)."""
    partition = i % partitions
    if bad is not None:
        value: bytes | None = BAD_VALUES[bad % len(BAD_VALUES)]
    else:
        value = json.dumps(
            {"order_id": i, "amount": f"{i % 1000}.25", "created_at": f"2026-11-{1 + i % 28:02d}T10:00:00Z"}
        ).encode()
    return partition, f"k{i}".encode(), value, [("trace", str(i).encode())]


@dataclass
class Env:
    """One test's pipeline: a unique topic and tables, a config file, and helpers to drive them."""

    bootstrap: str
    topic: str
    partitions: int
    config_path: Path
    produced: int = 0
    bad: int = 0
    #: every record produced through :meth:`send` (and so :meth:`produce`), with its offset
    log: Log = field(default_factory=Log)

    @property
    def config(self) -> PipelineConfig:
        return config_module.load(self.config_path)

    def produce(self, count: int, bad_every: int = 0) -> None:
        start = self.produced
        records = []
        dead = []
        for i in range(start, start + count):
            is_bad = bool(bad_every) and i % bad_every == bad_every - 1
            records.append(record(i, self.partitions, self.bad if is_bad else None))
            dead.append(is_bad)
            self.bad += is_bad
        self.send(self.topic, records, dead)
        self.produced += count

    def send(
        self,
        topic: str,
        records: Sequence[KafkaRecord],
        dead: list[bool] | None = None,
    ) -> None:
        """Produce ``records`` to ``topic`` and log them (``dead[i]``: record ``i`` is to be a dead
        letter), so that :meth:`exact` expects them."""
        produce(self.bootstrap, topic, records)
        self.log.add(topic, records, dead or [False] * len(records))

    def delete_records(self, before: Mapping[int, int]) -> None:
        """Delete the records of this topic's partitions below ``before[partition]``, as retention
        does (Kafka's DeleteRecords: the partition's low watermark moves there)."""
        from confluent_kafka import TopicPartition as KafkaTP
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # held until the futures are done
        deleted = admin.delete_records([KafkaTP(self.topic, partition, offset) for partition, offset in before.items()])
        for tp, future in deleted.items():
            assert future.result(30).low_watermark == before[tp.partition], tp

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ingest", *args]
        name = next((arg for arg in args if not arg.startswith("-")), None)  # after global options (-v)
        commands = ("run", "check", "status", "history", "verify", "reset", "replay", "maintain", "redrive")
        if name in (*commands, "evolve-partitioning"):
            command += ["-c", str(self.config_path)]
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "ingest", *args, "-c", str(self.config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )

    def verify(self) -> dict[str, Any]:
        result = self.cli("verify", "--json")
        assert result.stdout, result.stderr
        data: dict[str, Any] = json.loads(result.stdout.splitlines()[0])
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert data["ok"], data
        return data

    def counts(self) -> tuple[int, int]:
        """(rows, dead letters) in the tables, as a reader of the tables sees them."""
        from ingest.assembly import open_pipeline

        pipeline = open_pipeline(self.config)
        rows = pipeline.rows.table.scan(selected_fields=("_kafka_offset",)).to_arrow().num_rows
        dead = pipeline.dead.table.scan(selected_fields=("offset",)).to_arrow().num_rows
        return rows, dead

    def exact(self, lost: Mapping[int, tuple[int, int]] | None = None, foreign_rows: int = 0) -> dict[str, Any]:
        """The tables hold every logged record exactly once and by content, a good one as its row,
        a poison one as its dead letter (tests/content.py), and ``verify`` agrees; returns verify's
        document. ``lost``: per partition, the ``[start, end)`` of this topic that retention deleted
        unread (no row, no dead letter); ``foreign_rows``: rows another writer stored of other topics."""
        from ingest.assembly import open_pipeline

        pipeline = open_pipeline(self.config)
        rows = pipeline.rows.table.scan().to_arrow()
        dead = pipeline.dead.table.scan().to_arrow()
        ours = {sent.topic for sent in self.log.sent}
        others = rows.filter(pc.invert(pc.is_in(rows["_kafka_topic"], pa.array(sorted(ours)))))
        assert others.num_rows == foreign_rows, others.to_pylist()[:5]
        gone = lost or {}

        def kept(sent: Sent) -> bool:
            start, end = gone.get(sent.partition, (0, 0)) if sent.topic == self.topic else (0, 0)
            return not start <= sent.offset < end

        expected = [sent for sent in self.log.sent if kept(sent)]
        assert_holds(rows.filter(pc.is_in(rows["_kafka_topic"], pa.array(sorted(ours)))), dead, expected)
        return self.verify()


def _catalog(kind: str, tmp_path: Path, name: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The ``catalog:`` section for catalog kind ``kind`` (``catalog[+storage]``)."""
    catalog, _, storage = kind.partition("+")
    s3: dict[str, str] = request.getfixturevalue("s3").properties() if storage == "s3" else {}
    if catalog == "rest":
        rest: RestCatalog = request.getfixturevalue("rest_s3" if s3 else "rest_local")
        return {"name": "lake_rest", "type": "rest", "uri": rest.uri, **s3}
    if catalog == "glue":
        glue = {f"glue.{key.removeprefix('s3.')}": value for key, value in s3.items()}
        return {"name": "lake_glue", "type": "glue", "warehouse": f"s3://lake/glue-{name}", **glue, **s3}
    uri = f"sqlite:///{tmp_path}/catalog.db" if catalog == "sqlite" else POSTGRES_URI
    if s3:
        warehouse = f"s3://lake/{tmp_path.name}-{name}"
    else:
        (tmp_path / "warehouse").mkdir(exist_ok=True)
        warehouse = (tmp_path / "warehouse").as_uri()
    return {"name": f"lake_{catalog}", "type": "sql", "uri": uri, "warehouse": warehouse, **s3}


class MakeEnv(Protocol):
    """The :func:`make_env` fixture: a new :class:`Env` (a topic of ``partitions`` and a pipeline
    config reading it; ``overrides`` replace top-level sections of the config)."""

    def __call__(self, partitions: int = 4, cluster: str | None = None, replicas: int = 1, **overrides: Any) -> Env: ...


@pytest.fixture
def make_env(bootstrap: str, tmp_path: Path, catalog_kind: str, request: pytest.FixtureRequest) -> MakeEnv:
    def factory(partitions: int = 4, cluster: str | None = None, replicas: int = 1, **overrides: Any) -> Env:
        """A topic of ``partitions`` and a pipeline config reading it: on the session broker, or on
        ``cluster`` (a bootstrap string) with ``replicas`` copies of each partition."""
        servers = cluster or bootstrap
        name = f"t{uuid.uuid4().hex[:10]}"
        if replicas == 1:
            create_topic(servers, name, partitions)
        else:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": servers})  # held until the futures are done
            for future in admin.create_topics([NewTopic(name, partitions, replicas)]).values():
                future.result(30)
        properties = _catalog(catalog_kind, tmp_path, name, request)
        data: dict[str, Any] = {
            "pipeline": "orders",
            "kafka": {"bootstrap.servers": servers},
            "topics": [name],
            "catalog": properties,
            "table": f"{name}.orders",
            "schema": SCHEMA,
            "partition_by": ["day(created_at)"],
            "batch": {"max_records": 2_000, "read_timeout_s": 20},
            **overrides,
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return Env(servers, name, partitions, path)

    return factory


def summary_of(snapshot: Snapshot | None) -> dict[str, str]:
    """The properties of a snapshot's summary (pyiceberg types both as optional: a table has no
    current snapshot before its first commit, and every snapshot a writer commits has a summary)."""
    assert snapshot is not None and snapshot.summary is not None, snapshot
    return snapshot.summary.additional_properties


def workers_of(pid: int) -> list[int]:
    """Live worker processes started by process ``pid`` (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"ingest.engines.workers" in argv and argv[-2:-1] == [str(pid).encode()] and state != "Z":
            found.append(int(entry.name))
    return found


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while workers_of(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def produce_numbered(env: Env, topic: str, partitions: int, first: int, count: int, bad_every: int) -> int:
    """Records ``first`` .. ``first + count`` into ``topic``; returns how many are poison."""
    bad = [i % bad_every == bad_every - 1 for i in range(first, first + count)]
    numbered = zip(range(first, first + count), bad, strict=True)
    env.send(topic, [record(i, partitions, i if is_bad else None) for i, is_bad in numbered], bad)
    return sum(bad)


#: where the first copy of a race waits (SIGSTOP, ``ingest/failpoints.py``) until another copy has
#: committed: its first batch's (or redrive's) files are written and its commit not yet tried
PAUSE = "files-written#1:stop"


def committed_a_batch(line: dict[str, Any]) -> bool:
    """Whether an ``ingest run --json`` line is of a batch this copy committed."""
    return line.get("status") == "committed"


def met_another_copy(copy: Copy) -> bool:
    """Whether one of a copy's batches met another copy's commit: found already landed, fenced and
    planned again, a commit refused as a conflict, or fenced too often (75)."""
    for line in copy.lines:
        retries = line.get("commit_retries", {})
        if line.get("status") == "landed" or retries.get("fenced") or retries.get("conflict"):
            return True
    return any(line.get("type") == "Fenced" for line in copy.lines)


@dataclass
class Copy:
    """One racing copy (a command whose stdout is ``--json`` lines), read as it runs."""

    process: subprocess.Popen[str]
    #: whether a ``--json`` line says this copy committed something
    moved: Callable[[dict[str, Any]], bool]
    lines: list[dict[str, Any]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    committed: threading.Event = field(default_factory=threading.Event)
    readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        command: list[str],
        env: dict[str, str] | None = None,
        moved: Callable[[dict[str, Any]], bool] = committed_a_batch,
    ) -> Copy:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        copy = cls(process, moved)
        copy.readers = [threading.Thread(target=read, daemon=True) for read in (copy._read_stdout, copy._read_stderr)]
        for reader in copy.readers:
            reader.start()
        return copy

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):  # (spark-submit's driver writes its log lines to stdout too)
                self.lines.append(json.loads(line))
                if self.moved(self.lines[-1]):
                    self.committed.set()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(self.process.stderr)

    def paused(self) -> bool:
        """Whether the process is stopped (``T`` in /proc: it reached the :data:`PAUSE` failpoint)."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def wait(self, timeout_s: float = 300) -> int:
        code = self.process.wait(timeout_s)
        for reader in self.readers:  # to the pipes' last lines
            reader.join(30)
        return code

    @property
    def said(self) -> str:
        return "".join(self.stderr)[-3000:]


def contend(
    commands: list[tuple[list[str], dict[str, str] | None]],
    moved: Callable[[dict[str, Any]], bool] = committed_a_batch,
    met: Callable[[Copy], bool] = met_another_copy,
    codes: tuple[int, ...] = (0, 75),
) -> list[Copy]:
    """Run ``commands`` (each with its environment; ``--json`` output) as racing copies that
    certainly contend: the first pauses at :data:`PAUSE` (its first batch planned, its files
    written), the others start, and once one of them has committed (``moved`` says so of a line)
    the first goes on, to commit on a ledger that moved under it, while the others run on. Each
    copy ends with one of ``codes`` (done, or fenced too often), and the first is shown to have
    met another's commit (``met``)."""
    command, env = commands[0]
    first = Copy.start(command, {**(env or {}), "INGEST_FAILPOINT": PAUSE}, moved)
    copies = [first]
    try:
        deadline = time.monotonic() + 120
        while not first.paused():
            assert first.process.poll() is None, f"the first copy ended before it paused: {first.said}"
            assert time.monotonic() < deadline, "the first copy did not reach its pause"
            time.sleep(0.02)
        copies += [Copy.start(command, env, moved) for command, env in commands[1:]]
        deadline = time.monotonic() + 300
        while not any(copy.committed.is_set() for copy in copies[1:]):
            if all(copy.process.poll() is not None for copy in copies[1:]):
                for copy in copies[1:]:
                    copy.wait()  # (its last lines)
                assert any(copy.committed.is_set() for copy in copies[1:]), [copy.said for copy in copies[1:]]
            assert time.monotonic() < deadline, "no other copy committed in 300 s"
            time.sleep(0.02)
        first.process.send_signal(signal.SIGCONT)
        for copy in copies:
            assert copy.wait() in codes, copy.said
    finally:
        for copy in copies:  # none outlives a failed race (a stopped one dies of SIGKILL too)
            if copy.process.poll() is None:
                copy.process.kill()
                copy.process.wait()
    assert met(first), (first.lines, first.said)
    return copies


def race(paths: list[Path], *args: str) -> list[Copy]:
    """``ingest run --until-caught-up --json`` of each config in ``paths`` at once, contending for
    certain (:func:`contend`); each ends done (0) or fenced (75)."""
    command = [sys.executable, "-m", "ingest", "run", "--until-caught-up", "--json", *args]
    return contend([([*command, "-c", str(path)], None) for path in paths])


@dataclass
class Routed:
    """A config of two tables: topics ``a1`` and ``a2`` into ``orders``, ``b`` (and, by pattern,
    ``b_…``) into ``refunds``."""

    env: Env
    path: Path
    topics: dict[str, str]
    produced: Counter[str] = field(default_factory=Counter)
    bad: Counter[str] = field(default_factory=Counter)

    @property
    def tables(self) -> tuple[str, str]:
        return f"{self.env.topic}.orders", f"{self.env.topic}.refunds"

    def produce(self, key: str, count: int, bad_every: int = 0, partitions: int = 2) -> None:
        table = self.tables[0] if key.startswith("a") else self.tables[1]
        bad = produce_numbered(self.env, self.topics[key], partitions, self.produced[key], count, bad_every or 10**9)
        self.produced[key] += count
        self.produced[table] += count
        self.bad[table] += bad

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ingest", *args, "-c", str(self.path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )

    def counts(self, table: str) -> tuple[int, int]:
        from ingest.assembly import open_pipeline
        from ingest.config import load

        pipeline = open_pipeline(load(self.path, table=table))
        rows = pipeline.rows.table.scan(selected_fields=("_kafka_offset",)).to_arrow().num_rows
        dead = pipeline.dead.table.scan(selected_fields=("offset",)).to_arrow().num_rows
        return rows, dead

    def feeds(self, topic: str) -> str:
        """The table ``topic``'s records go to."""
        return self.tables[0] if topic in (self.topics["a1"], self.topics["a2"]) else self.tables[1]

    def exact(self) -> None:
        """Each table holds exactly the records of its topics, by content (tests/content.py), and
        ``verify`` agrees."""
        from ingest.assembly import open_pipeline
        from ingest.config import load

        for table in self.tables:
            assert self.counts(table) == (self.produced[table] - self.bad[table], self.bad[table]), table
            pipeline = open_pipeline(load(self.path, table=table))
            rows, dead = pipeline.rows.table.scan().to_arrow(), pipeline.dead.table.scan().to_arrow()
            assert_holds(rows, dead, [sent for sent in self.env.log.sent if self.feeds(sent.topic) == table])
        result = self.cli("verify", "--json")
        documents = [json.loads(line) for line in result.stdout.splitlines()]
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert [(d["table"], d["ok"]) for d in documents] == [(t, True) for t in self.tables]

    def with_cap(self, max_records: int) -> Path:
        data = yaml.safe_load(self.path.read_text())
        data["batch"] = {**data["batch"], "max_records": max_records}
        path = self.path.with_name(f"{self.path.stem}-{max_records}.yaml")
        path.write_text(yaml.safe_dump(data))
        return path


@pytest.fixture
def routed(make_env: MakeEnv) -> Routed:
    env: Env = make_env(partitions=2, batch={"max_records": 5_000, "read_timeout_s": 20})
    base = yaml.safe_load(env.config_path.read_text())
    topics = {"a1": f"{env.topic}_a1", "a2": f"{env.topic}_a2", "b": f"{env.topic}_b"}
    for name in topics.values():
        create_topic(env.bootstrap, name, 2)
    shared = {k: v for k, v in base.items() if k not in ("topics", "table", "schema", "partition_by")}
    entries = [
        {"table": f"{env.topic}.orders", "topics": [topics["a1"], topics["a2"]], "schema": base["schema"],
         "partition_by": base["partition_by"]},
        {"table": f"{env.topic}.refunds", "topics_pattern": f"{topics['b']}(_.*)?", "schema": base["schema"][:2]},
    ]  # fmt: skip
    path = env.config_path.with_name("routed.yaml")
    path.write_text(yaml.safe_dump({**shared, "tables": entries}))
    return Routed(env, path, topics)
