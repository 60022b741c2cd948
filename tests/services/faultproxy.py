"""A fault-injecting HTTP proxy for the tests, between pyiceberg's REST client and the catalog.

It forwards every request to the upstream server, except that the commits it is told to fault
(``POST /v1/namespaces/{ns}/tables/{table}``, the table commit endpoint) meet one fault:

- ``drop``: forwarded, and the catalog applied it; the client's connection is then closed with no
  response (a lost acknowledgement);
- ``error``: forwarded and applied; the client gets ``status`` (500 by default: pyiceberg's
  ``CommitStateUnknownException``) instead of the catalog's answer;
- ``hold``: forwarded and applied; the response is held for ``hold_s`` (past the client's timeout,
  or until ``disarm()``) and then dropped;
- ``refuse``: not forwarded at all; the client gets ``status`` (the commit never happened, and the
  client cannot tell).

``faulted`` counts the commits that met a fault; ``met`` is set once a commit met its fault (the
moment to SIGKILL the client: after forwarding, or instead of it for ``refuse``).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal
from urllib.parse import urlparse

Fault = Literal["drop", "error", "hold", "refuse"]
COMMIT = re.compile(r"^/v1/(?:[^/]+/)?namespaces/[^/]+/tables/[^/?]+$")
INJECTED = b'{"error": {"message": "injected by the test proxy", "type": "Fault", "code": 0}}'
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


@dataclass
class Plan:
    """Which commits meet which fault: the ``skip`` first commits pass, then ``count`` are faulted
    (``None``: all the rest); ``table`` limits it to the commits of tables whose name ends so."""

    fault: Fault | None = None
    skip: int = 0
    count: int | None = 1
    table: str = ""
    status: int = 500
    hold_s: float = 30.0
    seen: int = 0
    faulted: int = 0
    met: threading.Event = field(default_factory=threading.Event)
    #: ends a ``hold`` early (``disarm()``)
    released: threading.Event = field(default_factory=threading.Event)

    def take(self, path: str) -> Fault | None:
        """The fault for this commit request (None: pass it), counting it."""
        if self.fault is None or not path.rstrip("/").endswith(self.table):
            return None
        self.seen += 1
        if self.seen <= self.skip or (self.count is not None and self.faulted >= self.count):
            return None
        self.faulted += 1
        return self.fault


class FaultProxy:
    """The proxy on 127.0.0.1 and a free port, forwarding to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        target = urlparse(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.plan = Plan()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:  # this request's plan, whatever arm() or disarm() do meanwhile
                    plan = proxy.plan
                    commit = self.command == "POST" and COMMIT.match(self.path.split("?")[0])
                    fault = plan.take(self.path.split("?")[0]) if commit else None
                if fault == "refuse":
                    plan.met.set()
                    self._answer(plan.status, INJECTED, {})
                    return
                status, payload, headers = proxy._forward(self.command, self.path, self.headers, body)
                if fault is not None:
                    plan.met.set()
                if fault == "error":
                    self._answer(plan.status, INJECTED, {})
                elif fault in ("drop", "hold"):
                    if fault == "hold":
                        plan.released.wait(plan.hold_s)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                else:
                    self._answer(status, payload, headers)

            def _answer(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "content-type" not in {name.lower() for name in headers}:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, fault: Fault, **plan: object) -> Plan:
        """Fault the commits ``plan`` picks from now on (a new plan, counting from zero)."""
        with self._lock:
            self.plan = Plan(fault=fault, **plan)  # type: ignore[arg-type]
        return self.plan

    def disarm(self) -> None:
        with self._lock:
            self.plan.released.set()
            self.plan = Plan()

    def _forward(self, method: str, path: str, headers: Message, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
            connection.request(method, path, body=body or None, headers=sent)
            response = connection.getresponse()
            payload = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP}
            return response.status, payload, kept
        finally:
            connection.close()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
