"""How the Schema Registry adapter sorts a registry's failures: turned away (401/403) is a
configuration error, an error on its side or no answer is retryable, an unknown id is the record's
problem. The integration suite runs a real registry (Apicurio) with no authentication; the answers
of a secured one are served here by a small HTTP server on a free port."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ingest.errors import ExitCode, RegistryRefused, RegistryUnavailable
from ingest.kafka.embedded import free_port
from ingest.kafka.registry import Registry


def serving(status: int, code: int, message: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"error_code": code, "message": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


#: starts a server on a free port answering every request with ``(status, error code, message)``;
#: returns its URL
Answering = Callable[[int, int, str], str]


@pytest.fixture
def answering() -> Iterator[Answering]:
    servers: list[ThreadingHTTPServer] = []

    def start(status: int, code: int, message: str) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), serving(status, code, message))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def test_a_registry_that_turns_the_client_away_is_a_configuration_error(answering: Answering) -> None:
    url = answering(401, 40101, "Unauthorized")
    with pytest.raises(RegistryRefused, match=r"refused this client \(401: Unauthorized\).*basic.auth.user.info"):
        Registry({"url": url, "basic.auth.user.info": "me:wrong"}).by_id(1)
    assert RegistryRefused.exit_code is ExitCode.CONFIG


def test_an_error_on_the_registrys_side_or_no_answer_is_retryable(answering: Answering) -> None:
    url = answering(500, 50001, "Error in the backend data store")
    with pytest.raises(RegistryUnavailable, match=r"500 Error in the backend data store.*run again"):
        Registry({"url": url, "max.retries": 0}).by_id(1)
    with pytest.raises(RegistryUnavailable, match="cannot reach the Schema Registry"):
        Registry({"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0}).latest("orders-value")


def test_an_unknown_id_is_none_and_an_unknown_subject_says_what_to_do(answering: Answering) -> None:
    url = answering(404, 40403, "Schema 7 not found")
    assert Registry({"url": url}).by_id(7) is None
    with pytest.raises(RegistryRefused, match=r"has no subject 'orders-value'.*declare `schema:`"):
        Registry({"url": url}).latest("orders-value")
