"""A source's librdkafka clients, and what Kafka's failures are reported as.

A source keeps one admin client and builds a consumer for each read, with the settings of
:mod:`ingest.kafka.settings`; a property librdkafka does not know or refuses is a configuration
error naming it. librdkafka says why a request failed apart from the failure itself, to the
clients' ``error_cb``: the cluster refusing the client (authentication, TLS), every bootstrap broker
refusing connections, a response over the receive limit. :class:`Clients` keeps those reports and
turns a failed request into the error the command exits with: refused or no such host (fatal, the
config is wrong) or unavailable (retryable: nothing was committed).
"""

from __future__ import annotations

import collections
import logging
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from ingest.errors import BrokerUnavailable, ConfigError, IngestError, KafkaRefused
from ingest.kafka.settings import admin_config, consumer_config

T = TypeVar("T")

#: what librdkafka reports (to ``error_cb``, while the request itself fails as a mere transport
#: error) when the cluster turns the client away rather than being unreachable
REFUSALS = (KafkaError._AUTHENTICATION, KafkaError._SSL)
#: the same, answered per topic in metadata
TOPIC_REFUSALS = (KafkaError.TOPIC_AUTHORIZATION_FAILED,)
#: librdkafka's own log lines (connection failures while it retries, ...): with ``-v`` only, the
#: error that ends the command says what happened
LIBRDKAFKA_LOG = logging.getLogger("ingest.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(lambda record: logging.getLogger().isEnabledFor(logging.INFO))
REFUSED_HINT = (
    "Check `kafka:` in the config: security.protocol, sasl.mechanism, sasl.username and sasl.password "
    "(usually ${ENV} references), ssl.ca.location, and the principal's ACLs. Retrying will not help."
)
#: how librdkafka reports a response larger than ``receive.message.max.bytes`` (to ``error_cb``,
#: while the connection is dropped and the same fetch fails again and again)
OVERSIZED = re.compile(r"Invalid response size (\d+) \(0\.\.(\d+)\)")
#: what ``getaddrinfo`` says of a name that does not exist (as opposed to a DNS server not answering)
NO_SUCH_NAME = frozenset({socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)})


def unresolvable(servers: str) -> str | None:
    """Why no host of ``servers`` (``bootstrap.servers``) can be reached whatever the brokers do: no
    host name in it exists (a typo, a name known only inside another network). None if any host
    resolves, or if a lookup failed in a way that may pass (a DNS server not answering)."""
    reasons = []
    for server in filter(None, (part.strip() for part in servers.split(","))):
        address = server.split("://", 1)[-1]
        host = address[1:].split("]", 1)[0] if address.startswith("[") else address.rsplit(":", 1)[0]
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as error:
            if error.errno not in NO_SUCH_NAME:
                return None
            reasons.append(f"{host!r} ({error.strerror})")
        except (OSError, UnicodeError):
            return None
        else:
            return None  # this one exists
    return ", ".join(reasons) or None


def _built(client: Callable[[dict[str, Any]], T], conf: dict[str, Any]) -> T:
    """A librdkafka client of ``conf``; a property librdkafka does not know, or a value it refuses,
    is a configuration error naming it (librdkafka says which)."""
    try:
        return client({"logger": LIBRDKAFKA_LOG, **conf})
    except KafkaException as error:
        cause = error.args[0] if error.args else None
        if isinstance(cause, KafkaError) and cause.code() == KafkaError._INVALID_ARG:
            raise ConfigError(
                f"kafka: librdkafka refused the configuration: {cause.str()}. Fix `kafka:` in the config (the keys "
                "are librdkafka's, https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)."
            ) from None
        raise


class Clients:
    """The librdkafka clients of one source: the admin client, built with it, and a consumer for
    each read; and what librdkafka reported of any of them through ``error_cb``."""

    def __init__(self, props: Mapping[str, Any], group_id: str, timeout_s: float) -> None:
        self.props = dict(props)
        self.group_id = group_id
        #: how long a request, or a read that gets nothing, may take
        self.timeout_s = timeout_s
        #: the latest refusals librdkafka reported, from any of these clients
        self.refusals: collections.deque[KafkaError] = collections.deque(maxlen=4)
        self.all_down = False  # every bootstrap broker refused a connection since the last check
        #: (response size, limit) of a response librdkafka dropped as over ``receive.message.max.bytes``
        self.oversized: tuple[int, int] | None = None
        self.admin = _built(AdminClient, {**admin_config(props, timeout_s), "error_cb": self._on_error})

    @property
    def servers(self) -> Any:
        """``bootstrap.servers``, as the errors name the cluster."""
        return self.props["bootstrap.servers"]

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in REFUSALS:
            self.refusals.append(error)
        elif error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
        elif (found := OVERSIZED.search(error.str())) is not None:
            self.oversized = (int(found.group(1)), int(found.group(2)))

    def failed(self, what: str, error: KafkaException | None = None) -> IngestError:
        """The error to raise when talking to Kafka failed: refused, or no bootstrap host exists (a
        config problem), or unavailable (then nothing of the batch was committed, and running again
        is the fix)."""
        self.admin.poll(0)  # serves error_cb: the reason behind a failed request comes this way
        if self.refusals:
            return KafkaRefused(
                f"Kafka at {self.servers} refused this client: {self.refusals[-1].str()}. " + REFUSED_HINT
            )
        servers = self.servers
        unknown = unresolvable(str(servers)) if self.all_down else None
        if unknown is not None:  # a broker that is down may come back; a name that does not exist will not
            return ConfigError(
                f"kafka.bootstrap.servers: no host of {servers!r} exists: {unknown}. Fix the host names in "
                "`kafka:` (a typo? a name known only inside the cluster's network?); retrying will not help."
            )
        cause = f": {error}" if error is not None else ""
        return BrokerUnavailable(f"{what}{cause}. Nothing was committed; run again when the broker is healthy.")

    def consumer(self, sized_for: int | None = None) -> Consumer:
        """A consumer for exact reads (see :func:`~ingest.kafka.settings.consumer_config`)."""
        return _built(Consumer, {**consumer_config(self.props, self.group_id, sized_for), "error_cb": self._on_error})
