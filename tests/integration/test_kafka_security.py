"""SASL/SCRAM over TLS: the pipeline passes Kafka's security settings through, takes the credentials
from ``${ENV}`` references in its config, never prints them, and tells a refusal from an outage.

The broker is this module's own Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512, a certificate
self-signed for 127.0.0.1 by keytool) beside the PLAINTEXT one the test uses to create topics and
produce.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Env, MakeEnv, broker_choice
from tests.services import kafka as kafka_service

pytestmark = [
    pytest.mark.integration,
    # on tansu or an external cluster; where Apache Kafka cannot run, a strict run fails here (tests/strict.py)
    pytest.mark.skipif(
        broker_choice()[0] in ("tansu", "external"), reason="starts its own Apache Kafka: " + broker_choice()[1]
    ),
    pytest.mark.parametrize("catalog_kind", ["sqlite"]),  # the Kafka connection is under test here
]

USER = "ingest-svc"
PASSWORD = f"pw-{uuid.uuid4().hex}"  # unguessable, so finding it anywhere means it leaked


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_service.KafkaCluster]:
    with kafka_service.KafkaCluster(tmp_path_factory.mktemp("secured"), scram_users={USER: PASSWORD}) as cluster:
        yield cluster


def _secured_env(make_env: MakeEnv, secured: kafka_service.KafkaCluster, **kafka: str) -> Env:
    settings = {
        "bootstrap.servers": secured.secure_bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "${KAFKA_USER}",
        "sasl.password": "${KAFKA_PASSWORD}",
        "ssl.ca.location": str(secured.ca_location),
    }
    return make_env(
        partitions=2,
        cluster=secured.bootstrap_servers,  # the test's own producer and admin use PLAINTEXT
        kafka={**settings, **kafka},
        batch={"max_records": 1_000, "read_timeout_s": 10},
    )


def test_sasl_scram_over_tls_with_credentials_from_the_environment(
    make_env: MakeEnv, secured: kafka_service.KafkaCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KAFKA_USER", USER)
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    env = _secured_env(make_env, secured)
    assert "${KAFKA_PASSWORD}" in env.config_path.read_text()  # the file holds a reference, not the secret
    env.produce(3_000, bad_every=500)

    outputs = [
        env.cli("-v", "run", "--until-caught-up", "--json"),
        env.cli("status", "--json"),
        env.cli("status"),
        env.cli("history", "--json"),
        env.cli("verify", "--json"),
    ]
    env.produce(1_000)
    outputs.append(env.cli("-v", "run", "--until-caught-up"))  # the human form and its progress logs

    for done in outputs:
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout and PASSWORD not in done.stderr, done.args
    assert env.counts() == (3_994, 6)
    env.verify()
    batches = [json.loads(line) for line in outputs[0].stdout.splitlines()]
    assert sum(b["records"] + b["dead_letters"] for b in batches) == 3_000
    # nor is it written into the tables: metadata, manifests, data files and the catalog database
    for path in Path(tmp_path).rglob("*"):
        if path.is_file() and path.suffix != ".yaml":
            assert PASSWORD.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    ("case", "kafka", "says"),
    [
        ("wrong password", {"sasl.password": "not-the-password"}, "SASL authentication error"),
        ("unknown user", {"sasl.username": "nobody"}, "SASL authentication error"),
        ("untrusted certificate", {"ssl.ca.location": "another"}, "certificate verify failed"),
    ],
)
def test_a_refused_login_is_a_clear_non_retryable_error(
    make_env: MakeEnv,
    secured: kafka_service.KafkaCluster,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    case: str,
    kafka: dict[str, str],
    says: str,
) -> None:
    monkeypatch.setenv("KAFKA_USER", USER)
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    if kafka.get("ssl.ca.location") == "another":  # a CA that did not sign the broker's certificate
        other = tmp_path / "other-ca.pem"
        kafka_service.certificate(tmp_path / "other.p12", other, uuid.uuid4().hex)
        kafka = {"ssl.ca.location": str(other)}
    env = _secured_env(make_env, secured, **kafka)
    env.produce(10)

    for json_output in (True, False):
        done = env.cli("run", *(["--json"] if json_output else []))

        assert done.returncode == 78, (case, done.stderr)  # the configuration's problem: retrying cannot help
        assert "refused this client" in done.stderr and says in done.stderr, done.stderr
        assert "sasl.username and sasl.password" in done.stderr  # what to check
        assert PASSWORD not in done.stdout + done.stderr and "not-the-password" not in done.stdout + done.stderr
        if json_output:
            error = json.loads(done.stdout.splitlines()[-1])
            assert (error["kind"], error["type"]) == ("config", "KafkaRefused"), error
    assert env.counts() == (0, 0)
