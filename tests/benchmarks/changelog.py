"""The changelog stages of the benchmark (``changes:``): Debezium changes folded into a table
that already holds rows, against appends of as many records in the same run.

* ``changelog``: a topic of Debezium events, ``keys`` snapshot reads (``op: r``, a row each) and
  then ``changes`` changes over them (60 % updates and 10 % deletes of live keys, 30 % new keys).
  The snapshot lands first (untimed, in batches of ``keys``), then the changes in one timed batch:
  every key they touch has its live row deleted (position deletes) and its newest row added.
  ``changelog_append`` beside it: the ``ingest`` stage's orders, ``changes`` of them in one batch.
* ``changelog_4x``: the same batch of ``changes // 5`` changes into a table of ``keys`` rows and
  into one of ``4 × keys`` rows, each timed: its cost should grow with the batch and the key column
  it reads, not with the table.

By default (the benchmark's 2M records) 1M changes over 500k keys, and a 200k-change batch.
``python -m tests.benchmarks.changelog`` runs these stages alone (its report is appended to
``results.jsonl``, ``"suite": "changelog"``); ``make bench`` runs them with the others.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

#: the topics' names after the benchmark's ``--topic``
TOPIC, SMALL, LARGE = "-cdc", "-cdc-1x", "-cdc-4x"
SOURCE = (
    b'"source":{"version":"2.7.3.Final","connector":"postgresql","name":"dbserver1","ts_ms":%d,'
    b'"db":"inventory","schema":"public","table":"orders","lsn":%d}'
)
STATUSES = (b"paid", b"shipped", b"created")


def sizes(records: int) -> tuple[int, int, int]:
    """(keys, changes, changes of the 4× stage) for the benchmark's ``records``."""
    changes = max(1, records // 2)
    return max(1, changes // 2), changes, max(1, changes // 5)


def row(key: int, version: int) -> bytes:
    """The row of ``key`` as its ``version``-th change left it (the ``ingest`` stage's order columns)."""
    n = key + version * 7_919
    return (
        b'{"order_id":%d,"customer_id":%d,"status":"%s","amount":%d.%02d,"created_at":"2026-11-%02dT10:%02d:%02dZ"}'
        % (
            key,
            n * 7_919 % 100_000,
            STATUSES[n % 3],
            n % 900,
            n % 100,
            1 + n % 28,
            n % 60,
            version % 60,
        )
    )


def event(op: bytes, before: bytes, after: bytes, offset: int) -> bytes:
    """A Debezium change event in JSON (``schemas.enable=false``), as Debezium's PostgreSQL connector
    writes one."""
    ts = 1_796_000_000_000 + offset
    return b'{"before":%s,"after":%s,%s,"op":"%s","ts_ms":%d}' % (before, after, SOURCE % (ts, offset), op, ts)


def snapshot(keys: int) -> Iterator[tuple[int, bytes]]:
    """(key, event) of a snapshot of ``keys`` rows: a read (``op: r``) of each."""
    for key in range(keys):
        yield key, event(b"r", b"null", row(key, 0), key)


def changes(keys: int, count: int, first_new: int, seed: int) -> Iterator[tuple[int, bytes | None]]:
    """(key, event or None) of ``count`` changes to a table of ``keys`` rows (keys ``0..keys-1``):
    60 % updates and 10 % deletes of live keys, 30 % creates of new keys from ``first_new`` on;
    each delete followed by its tombstone (None), as Debezium sends it."""
    rng = random.Random(seed)
    live = list(range(keys))
    versions: dict[int, int] = {}
    new = first_new
    made = 0
    while made < count:
        pick = rng.random()
        if pick < 0.3 or not live:
            key, new = new, new + 1
            live.append(key)
            versions[key] = 0
            yield key, event(b"c", b"null", row(key, 0), made)
        else:
            at = rng.randrange(len(live))
            key = live[at]
            version = versions.get(key, 0)
            if pick < 0.9:
                versions[key] = version + 1
                yield key, event(b"u", row(key, version), row(key, version + 1), made)
            else:
                live[at] = live[-1]
                live.pop()
                yield key, event(b"d", row(key, version), b"null", made)
                yield key, None
        made += 1


def produce_topics(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """The stages' topics, ``args.partitions`` partitions each, a key's events in partition
    ``key mod partitions``: snapshot then changes."""
    from ingest.kafka.admin import create_topic, produce

    keys, count, small = sizes(args.records)
    started = time.perf_counter()
    for suffix, rows, batch in ((TOPIC, keys, count), (SMALL, keys, small), (LARGE, 4 * keys, small)):
        topic = args.topic + suffix
        create_topic(args.bootstrap, topic, args.partitions)
        # the 4× stage's two tables take the same changes: to keys of the smaller, new keys past the larger
        events = [*snapshot(rows), *changes(keys, batch, 4 * keys, seed=38)]
        produce(
            args.bootstrap,
            topic,
            ((key % args.partitions, b"%d" % key, value, None) for key, value in events),
        )
    say(f"produced the changelog topics in {time.perf_counter() - started:.1f}s")


def _changelog_config(args: argparse.Namespace, tmp: str, suffix: str, max_records: int) -> Any:
    from ingest import config as config_module
    from tests.benchmarks import bench

    data = bench._config(args, tmp) | {
        "topics": [{"name": args.topic + suffix, "format": "json"}],
        "changes": {"envelope": "debezium", "key": ["order_id"]},
        "batch": {"max_records": max_records},
    }
    return config_module.parse(data)


def _fold_timed(args: argparse.Namespace, suffix: str, rows: int) -> dict[str, Any]:
    """Land the ``rows`` snapshot events of the topic (untimed), then time one batch of all the
    rest on a new run, as the next scheduled ``ingest run`` would. Its records are the offsets it
    read (a delete's tombstone is one too)."""
    from ingest.runner import opened
    from tests.benchmarks import bench

    with tempfile.TemporaryDirectory() as tmp:
        with opened(_changelog_config(args, tmp, suffix, max(1, args.records // 4))) as loading:
            loaded = 0
            while loaded < rows:
                loaded += loading.batch().records
        with opened(_changelog_config(args, tmp, suffix, 10 * args.records)) as run:
            started = time.perf_counter()
            result = run.batch()
            seconds = time.perf_counter() - started
            workers_mb = bench._workers_peak_rss_mb()
            table_rows = run.pipeline.rows.table.scan().count()
    return {
        "records": sum(end - start for *_, start, end in result.ranges),
        "rows": result.records,
        "dead_letters": result.dead_letters,
        "bytes": result.bytes,
        "seconds": seconds,
        "rows_before": rows,
        "table_rows_after": table_rows,
        "children_peak_rss_mb": workers_mb,
    }


def stage_changelog(args: argparse.Namespace) -> dict[str, Any]:
    keys, _, _ = sizes(args.records)
    return _fold_timed(args, TOPIC, keys)


def stage_changelog_append(args: argparse.Namespace) -> dict[str, Any]:
    from tests.benchmarks import bench

    _, count, _ = sizes(args.records)
    return bench._ingest(args, {"batch": {"max_records": count}})


def stage_changelog_4x(args: argparse.Namespace) -> dict[str, Any]:
    keys, _, _ = sizes(args.records)
    one = _fold_timed(args, SMALL, keys)
    four = _fold_timed(args, LARGE, 4 * keys)
    return four | {"seconds_1x": one["seconds"], "seconds_4x": four["seconds"], "one": one}


STAGES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "changelog": stage_changelog,
    "changelog_append": stage_changelog_append,
    "changelog_4x": stage_changelog_4x,
}


def run(args: argparse.Namespace, run_stage: Callable[[str, argparse.Namespace], dict[str, Any]]) -> dict[str, Any]:
    """The three stages (their topics produced: :func:`produce_topics`)."""
    return {name: run_stage(name, args) for name in STAGES}


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The targets' figures: the fold's rate against the appends' (≥ 0.3), the 4× table's batch
    time against the 1× table's (≤ 1.5), and the fold's peak RSS against the appends' budget."""
    fold, append, four = results["changelog"], results["changelog_append"], results["changelog_4x"]
    return {
        "changelog_vs_append": fold["records_per_s"] / append["records_per_s"],
        "changelog_4x_vs_1x": four["seconds_4x"] / four["seconds_1x"],
        "changelog_rss_vs_budget": fold["peak_rss_mb"] / (4 * fold["bytes"] / 1e6 + 400),
    }


def summary(results: dict[str, dict[str, Any]]) -> str:
    found = ratios(results)
    marks = {
        "changelog_vs_append": found["changelog_vs_append"] < 0.3,
        "changelog_4x_vs_1x": found["changelog_4x_vs_1x"] > 1.5,
        "changelog_rss_vs_budget": found["changelog_rss_vs_budget"] > 1.0,
    }
    cells = [f"{name} {value:.2f}{' ✗' if marks[name] else ''}" for name, value in found.items()]
    return "changelog (targets: vs append ≥ 0.3, 4x vs 1x ≤ 1.5, RSS vs budget ≤ 1): " + ", ".join(cells)


def main() -> None:
    """The changelog stages alone, on the embedded broker."""
    from rich.console import Console

    from ingest.kafka.admin import create_topic, produce
    from ingest.kafka.embedded import EmbeddedBroker
    from tests.benchmarks import bench

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    args.topic, args.tables_records, args.s3, args.registry = "bench", 0, None, None
    console = Console(stderr=True)
    with EmbeddedBroker() as broker:
        args.bootstrap = broker.bootstrap_servers
        create_topic(args.bootstrap, args.topic, args.partitions)
        produce(
            args.bootstrap,
            args.topic,
            ((i % args.partitions, None, bench.payload(i), None) for i in range(args.records)),
        )
        produce_topics(args, console.print)
        results = run(args, bench.run_stage)
    for name, result in results.items():
        rate, seconds, rss = result["records_per_s"], result["seconds"], result["peak_rss_mb"]
        console.print(f"{name}: {rate:,.0f} records/s, {seconds:.2f}s, {rss:,.0f} MB")
    console.print(summary(results))
    bench.record("changelog", args, results, ratios(results))


if __name__ == "__main__":
    main()
