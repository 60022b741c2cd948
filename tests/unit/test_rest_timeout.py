"""A REST catalog that accepts connections and never answers: the catalog does not open, within
the request timeout, retryably (pyiceberg alone would wait for ever)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ingest.errors import CatalogUnavailable
from ingest.iceberg.catalog import connect


@pytest.fixture
def silent() -> Iterator[str]:
    """A TCP server that takes every connection and the request, and says nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def test_a_rest_catalog_that_never_answers_is_unavailable_after_the_timeout(silent: str) -> None:
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable, match="timed out"):
        connect({"name": "lake", "type": "rest", "uri": silent}, request_timeout_s=1.0)
    assert time.monotonic() - started < 10
