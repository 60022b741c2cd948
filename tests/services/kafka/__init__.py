"""Apache Kafka for the test suite: resolved from Maven Central, run in KRaft mode on free ports.

``resolve()`` copies the broker's jars (``pom.xml`` beside this file) into
``.cache/kafka-<version>/lib`` with Maven, once (:mod:`tests.services.maven`);
:class:`KafkaCluster` formats storage for one or more combined broker/controller nodes in a
directory of its own, starts one JVM per node, is ready when a metadata request lists every node,
and stops them. Nothing here is used by the pipeline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ingest.kafka.embedded import free_port
from tests.services import maven

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
POM = HERE / "pom.xml"
VERSION = maven.pinned(POM, "kafka.version")
CACHE = REPO / ".cache" / f"kafka-{VERSION}"
LIB = CACHE / "lib"
LOG4J = """\
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class KafkaUnavailable(Exception):
    """Java or Maven is missing, Maven could not resolve the broker, or a node would not start."""


def unavailable() -> str | None:
    """Why Apache Kafka cannot run here (None: it can)."""
    return maven.unavailable(LIB)


def resolve() -> Path:
    """The broker's classpath directory, resolving it from Maven Central the first time."""
    try:
        return maven.resolve(POM, LIB, f"Apache Kafka {VERSION}")
    except maven.MavenUnavailable as error:
        raise KafkaUnavailable(str(error)) from None


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    secure_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None


class KafkaCluster:
    """``nodes`` Apache Kafka processes, each broker and controller, on 127.0.0.1 and free ports.

    Every node has a PLAINTEXT listener (``bootstrap_servers``: the tests' own admin and producers).
    Given ``scram_users`` (name → password), every node also has a SASL_SSL listener
    (``secure_bootstrap_servers``) taking SCRAM-SHA-512 logins of those users over TLS, its
    certificate self-signed for 127.0.0.1 by ``keytool`` (the CA for clients: ``ca_location``).
    """

    MECHANISM = "SCRAM-SHA-512"

    def __init__(
        self,
        workdir: Path,
        nodes: int = 1,
        settings: dict[str, str] | None = None,
        scram_users: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.cluster_id = ""
        self.settings = settings or {}
        self.scram_users = scram_users or {}
        self.nodes = [
            _Node(i + 1, free_port(), free_port(), free_port(), workdir / f"node-{i + 1}") for i in range(nodes)
        ]
        self.keystore = workdir / "broker.p12"
        self.ca_location = workdir / "ca.pem"
        self._store_password = uuid.uuid4().hex

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def secure_bootstrap_servers(self) -> str:
        assert self.scram_users, "no SASL_SSL listener: start the cluster with scram_users"
        return ",".join(f"127.0.0.1:{node.secure_port}" for node in self.nodes)

    def pid(self, node: int = 1) -> int:
        process = self.nodes[node - 1].process
        assert process is not None
        return process.pid

    def _properties(self, node: _Node) -> str:
        replicas = min(3, len(self.nodes))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "transaction.state.log.num.partitions": "4",
            "default.replication.factor": str(replicas),
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.check.interval.ms": "1000",
            "log.cleaner.backoff.ms": "250",  # compacted-topic tests wait for the cleaner
            **self.settings,
        }
        if self.scram_users:
            secure = f"SASL_SSL://127.0.0.1:{node.secure_port}"
            settings["listeners"] += f",{secure}"
            settings["advertised.listeners"] += f",{secure}"
            settings["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
            settings |= {
                "sasl.enabled.mechanisms": self.MECHANISM,
                f"listener.name.sasl_ssl.{self.MECHANISM.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(self.keystore),
                "ssl.keystore.password": self._store_password,
                "ssl.key.password": self._store_password,
            }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _java(self, *args: str, log: Path | None = None) -> list[str]:
        options = ["-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        if log is not None:
            options.append(f"-Dlog4j2.configurationFile={log}")
        return ["java", *options, "-cp", f"{resolve()}/*", *args]

    def start(self, timeout_s: float = 90.0) -> KafkaCluster:
        self.cluster_id = self.cluster_id or _cluster_id()
        if self.scram_users:
            certificate(self.keystore, self.ca_location, self._store_password)
        users = [
            arg
            for name, password in self.scram_users.items()
            for arg in ("--add-scram", f"{self.MECHANISM}=[name={name},password={password}]")
        ]
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            config = node.directory / "server.properties"
            config.write_text(self._properties(node))
            (node.directory / "log4j2.properties").write_text(LOG4J.format(log=node.directory / "server.log"))
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}", "-c", str(config), *users
                ),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if formatted.returncode != 0:
                raise KafkaUnavailable(f"formatting KRaft storage failed: {formatted.stdout}{formatted.stderr}")
        for node in self.nodes:
            self.start_node(node.node_id, wait=False)
        self.wait_ready(timeout_s)
        return self

    def start_node(self, node_id: int, wait: bool = True) -> None:
        node = self.nodes[node_id - 1]
        out = open(node.directory / "stdout.log", "ab")  # noqa: SIM115  (kept by the process)
        node.process = subprocess.Popen(
            self._java(
                "kafka.Kafka", str(node.directory / "server.properties"), log=node.directory / "log4j2.properties"
            ),
            stdout=out,
            stderr=out,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until a metadata request lists every running node; raises if a node exits or time runs out."""
        from confluent_kafka.admin import AdminClient

        running = {n.node_id for n in self.nodes if n.process is not None and n.process.poll() is None}
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.node_id in running and node.process is not None and node.process.poll() is not None:
                    raise KafkaUnavailable(
                        f"Kafka node {node.node_id} exited with code {node.process.returncode}; "
                        f"see {node.directory / 'server.log'}"
                    )
            try:
                if set(admin.list_topics(timeout=2).brokers) >= running:
                    return
            except Exception:  # not answering yet
                pass
            time.sleep(0.2)
        self.stop()
        raise KafkaUnavailable(f"Apache Kafka did not list its {len(running)} node(s) within {timeout_s}s")

    def stop_node(self, node_id: int, sig: int = signal.SIGTERM) -> None:
        node = self.nodes[node_id - 1]
        process, node.process = node.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node.node_id)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()


def certificate(keystore: Path, ca_location: Path, password: str) -> None:
    """A PKCS12 ``keystore`` with a key pair and a certificate self-signed for 127.0.0.1 (a broker's),
    and that certificate as PEM in ``ca_location`` (what its clients trust)."""
    if shutil.which("keytool") is None:
        raise KafkaUnavailable("keytool (the JDK's) is not on PATH: it makes the SASL_SSL listener's certificate")
    keystore.parent.mkdir(parents=True, exist_ok=True)
    keystore.unlink(missing_ok=True)
    store = ["-keystore", str(keystore), "-storetype", "PKCS12", "-storepass", password]
    for step in (
        [
            *("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "7"),
            *("-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-keypass", password),
        ],
        ["-exportcert", "-rfc", "-alias", "broker", "-file", str(ca_location)],
    ):
        done = subprocess.run(["keytool", *step, *store], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise KafkaUnavailable(f"keytool {step[0]} failed: {done.stdout}{done.stderr}")


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def describe() -> str:
    return f"Apache Kafka {VERSION} (KRaft, from Maven Central into {os.path.relpath(CACHE, REPO)})"
