"""The librdkafka settings of a source's clients, built from the config's ``kafka:`` properties.

A source reads exact offset ranges (``assign()``, no group subscription, no auto-commit,
``auto.offset.reset=error``, ``read_committed``): this module holds those exact-read settings, the
fetch settings tuned for bulk range reads, how a consumer's and the admin client's properties are
made of them and of the config's own, and the largest response a consumer so configured accepts.
Pure: it builds dictionaries, no client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: fetch settings for bulk range reads. ``fetch.queue.backoff.ms`` matters most: when a fetch
#: leaves more than ``queued.min.messages`` waiting for a partition, librdkafka's default is to
#: fetch that partition again only a full second later; a reader that drains the queue in
#: milliseconds then idles (docs/performance.md). With that backoff, 20k messages waiting per
#: partition (librdkafka's default: 100k) read as fast, on four partitions and on one, and the
#: process peaks ~20-40 MB lower.
FETCH_DEFAULTS: dict[str, Any] = {
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
    "queued.max.messages.kbytes": 262_144,
    "queued.min.messages": 20_000,
    "fetch.queue.backoff.ms": 10,
}
#: a generous guess of a record's size on the wire, to size fetches for small ranges
FETCH_BYTES_PER_RECORD = 1024
EXACT_READ: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
}
#: librdkafka's ``receive.message.max.bytes`` when it is not set (raised to ``fetch.max.bytes`` + 512
#: when that is larger)
RECEIVE_DEFAULT = 100_000_000
#: what a fetch response adds around the record batches it carries (librdkafka's own allowance)
RESPONSE_OVERHEAD = 512


def admin_config(props: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """The properties of a source's admin client: the config's ``kafka:`` properties but those only
    a consumer takes, its requests' socket timeout ``timeout_s``."""
    consumer_only = {"group.id", *FETCH_DEFAULTS, *EXACT_READ}
    admin = {k: v for k, v in props.items() if k not in consumer_only and not k.startswith(("fetch.", "max.poll"))}
    return {**admin, "socket.timeout.ms": int(timeout_s * 1000)}


def consumer_config(props: Mapping[str, Any], group_id: str, sized_for: int | None = None) -> dict[str, Any]:
    """The properties of every consumer a run builds: the fetch settings for bulk range reads under
    the config's own ``kafka:`` properties, and the exact-read settings over both. ``sized_for``
    (records in the largest range) caps the per-partition fetch so a small batch does not pull
    megabytes it will drop."""
    fetch = dict(FETCH_DEFAULTS)
    if sized_for is not None:
        fetch["max.partition.fetch.bytes"] = min(
            FETCH_DEFAULTS["max.partition.fetch.bytes"], max(1 << 20, sized_for * FETCH_BYTES_PER_RECORD)
        )
    return {**fetch, **props, "group.id": group_id, **EXACT_READ}


def receive_limit(conf: Mapping[str, Any]) -> int:
    """The largest response a consumer of ``conf`` (one librdkafka accepted) takes from a broker."""
    if "receive.message.max.bytes" in conf:
        return int(conf["receive.message.max.bytes"])
    return max(RECEIVE_DEFAULT, int(conf.get("fetch.max.bytes", 0)) + RESPONSE_OVERHEAD)
