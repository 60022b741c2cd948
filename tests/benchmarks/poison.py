"""The poison stages of the benchmark: every kind of bad record the project knows, in JSON and in
Avro, at 1 % and 10 % of a topic of the benchmark's orders (and a JSON topic all poison), each
ingested in one batch as the ``ingest`` stage is, to compare with it: each poison run is paired
with a run of the clean stage just before it, and a stage's ratio is the median of three pairs.

``python -m tests.benchmarks.poison`` runs these stages and the clean ones alone (its report is
appended to ``results.jsonl``, ``"suite": "poison"``); ``make bench`` runs them with the others.
"""

from __future__ import annotations

import argparse
import statistics
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: the limit the ``oversized`` stages set (``dead_letters.max_value_bytes``), twice the longest
#: good value; an oversized value is a good one padded past it (to 300-400 bytes: the stage
#: measures setting values aside, not moving ten times the bytes)
MAX_VALUE_BYTES = 256
PADDING = MAX_VALUE_BYTES


def _drift(value: bytes) -> bytes:
    """``amount`` a string where a double is declared: a producer deployed a type change."""
    return value.replace(b'"amount":', b'"amount":"').replace(b',"created_at"', b'","created_at"')


def _malformed(value: bytes) -> bytes:
    """The value cut short: not JSON at all."""
    return value[:-9]


def _missing(value: bytes) -> bytes:
    """``order_id`` (required) left out."""
    return b"{" + value[value.index(b",") + 1 :]


def _oversized_json(value: bytes) -> bytes:
    """A good document padded past the limit (whitespace after it: still JSON)."""
    return value + b" " * PADDING


def _bad_magic(value: bytes) -> bytes:
    """Not the Confluent wire format: the first byte is not 0."""
    return b"\x01" + value[1:]


def _unknown_id(value: bytes) -> bytes:
    """Framed with a schema id the registry does not hold."""
    return value[:1] + struct.pack(">I", 999_999) + value[5:]


def _truncated(value: bytes) -> bytes:
    """The Avro body cut short (its last field incomplete)."""
    return value[:-4]


def _oversized_avro(value: bytes) -> bytes:
    return value + b"\x00" * PADDING


@dataclass(frozen=True)
class Poison:
    """One poison stage: ``every``-th record of a topic in ``format`` spoiled by ``spoil``."""

    format: str
    kind: str
    every: int
    spoil: Callable[[bytes], bytes]

    @property
    def name(self) -> str:
        return f"poison_{self.format}_{self.kind}_{100 // self.every}"

    @property
    def label(self) -> str:
        return f"ingest, {self.format.upper() if self.format == 'json' else 'Avro'}, {100 // self.every}% {self.kind}"

    def topic(self, base: str) -> str:
        return f"{base}-{self.name.replace('_', '-')}"

    def values(self, good: Iterable[bytes]) -> Iterator[bytes]:
        for i, value in enumerate(good):
            yield self.spoil(value) if i % self.every == 0 else value

    def overrides(self, topic: str, registry: str | None) -> dict[str, Any]:
        """The stage's config over the ``ingest`` stage's."""
        data: dict[str, Any] = {"topics": [{"name": topic, "format": self.format}]}
        if self.format == "avro":
            data |= {"schema_registry": {"url": registry}, "schema": None}
        if self.kind == "oversized":
            data["dead_letters"] = {"max_value_bytes": MAX_VALUE_BYTES}
        return data


#: a poison stage's runs, each paired with a run of its clean twin (:func:`run`)
PAIRS = 3
#: the clean stage of each format
CLEAN = {"json": "ingest", "avro": "avro_ingest"}
#: keys of a poison stage's result: its rate and peak RSS against its clean twin's
RATE, RSS = "rate_vs_clean", "rss_vs_clean"

JSON_KINDS = {"drift": _drift, "malformed": _malformed, "missing": _missing, "oversized": _oversized_json}
AVRO_KINDS = {"bad_magic": _bad_magic, "unknown_id": _unknown_id, "truncated": _truncated, "oversized": _oversized_avro}

#: every stage, by name: each kind at 1 % and 10 %, and a topic all drifted JSON
MATRIX = {
    poison.name: poison
    for poison in [
        *(Poison("json", kind, every, spoil) for kind, spoil in JSON_KINDS.items() for every in (100, 10)),
        Poison("json", "drift", 1, _drift),
        *(Poison("avro", kind, every, spoil) for kind, spoil in AVRO_KINDS.items() for every in (100, 10)),
    ]
}


def run(
    args: argparse.Namespace,
    formats: set[str],
    good: dict[str, Callable[[int | None], Iterable[bytes]]],
    prepare: Callable[[str, str], int | None],
    run_stage: Callable[[str, argparse.Namespace], dict[str, Any]],
    say: Callable[[str], None],
    pairs: int = PAIRS,
) -> dict[str, dict[str, Any]]:
    """Each stage of ``formats`` in turn: its topic created by ``prepare`` (which registers the
    Avro subject and gives its schema id), filled with ``good[format](schema id)`` spoiled, then
    ingested by ``run_stage`` ``pairs`` times, each right after a run of the clean stage of its
    format, and deleted (the embedded broker keeps topics in memory). A stage's result is its run
    of the median rate against its clean twin, with the median ratios (:data:`RATE`, :data:`RSS`)
    and every pair's figures: the host's speed swings by a fifth between runs minutes apart, a
    pair's runs seconds apart swing together."""
    from confluent_kafka.admin import AdminClient

    from ingest.kafka.admin import produce

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    results = {}
    for name, poison in MATRIX.items():
        if poison.format not in formats:
            continue
        topic = poison.topic(args.topic)
        values = poison.values(good[poison.format](prepare(poison.format, topic)))
        produce(args.bootstrap, topic, ((i % args.partitions, None, v, None) for i, v in enumerate(values)))
        runs = []
        for _ in range(pairs):
            clean = run_stage(CLEAN[poison.format], args)
            dirty = run_stage(name, args)
            expected = (args.records + poison.every - 1) // poison.every
            if dirty["dead_letters"] != expected or dirty["records"] != args.records:
                raise SystemExit(
                    f"{name}: {dirty['dead_letters']:,} dead letters of {dirty['records']:,} records, "
                    f"where {expected:,} of {args.records:,} records are poison"
                )
            dirty[RATE] = dirty["records_per_s"] / clean["records_per_s"]
            dirty[RSS] = dirty["peak_rss_mb"] / clean["peak_rss_mb"]
            runs.append((dirty, clean))
        median = sorted(runs, key=lambda run: run[0][RATE])[len(runs) // 2][0]
        results[name] = median | {
            RSS: statistics.median(dirty[RSS] for dirty, _ in runs),
            "pairs": [
                {"records_per_s": dirty["records_per_s"], "clean_records_per_s": clean["records_per_s"]}
                | {key: dirty[key] for key in (RATE, RSS, "peak_rss_mb")}
                | {"clean_peak_rss_mb": clean["peak_rss_mb"]}
                for dirty, clean in runs
            ],
        }
        say(
            f"{name}: {results[name]['records_per_s']:,.0f} records/s, {results[name][RATE]:.2f}x its clean twin "
            f"(median of {pairs}: " + ", ".join(f"{dirty[RATE]:.2f}" for dirty, _ in runs) + ")"
        )
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result()
    return results


def framed(bodies: list[bytes]) -> Callable[[int | None], Iterator[bytes]]:
    """Avro values of the Confluent wire format with the bodies of ``bodies`` (values framed
    with any id) under the schema id given."""

    def values(schema_id: int | None) -> Iterator[bytes]:
        assert schema_id is not None
        prefix = struct.pack(">bI", 0, schema_id)
        return (prefix + body[5:] for body in bodies)

    return values


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each poison stage's rate and peak RSS against the clean stage of its format: the median of
    its pairs (:func:`run`)."""
    out = {}
    for name in MATRIX:
        if name in results:
            out[f"{name}_vs_clean"] = results[name][RATE]
            out[f"{name}_rss_vs_clean"] = results[name][RSS]
    return out


def summary(results: dict[str, dict[str, Any]]) -> list[str]:
    """A line per format: each stage's rate and peak RSS against the clean stage, a ✗ where a target is missed."""
    found = ratios(results)
    lines = []
    for fmt in ("json", "avro"):
        cells = []
        for name, poison in MATRIX.items():
            if poison.format != fmt or f"{name}_vs_clean" not in found:
                continue
            rate, rss = found[f"{name}_vs_clean"], found[f"{name}_rss_vs_clean"]
            floor = {100: 0.8, 10: 0.6}.get(poison.every)
            missed = floor is not None and (rate < floor or rss > 1.3)
            cells.append(f"{poison.kind} {100 // poison.every}% {rate:.2f}/{rss:.2f}{' ✗' if missed else ''}")
        if cells:
            lines.append(
                f"poison ({fmt.upper() if fmt == 'json' else 'Avro'}), rate/RSS against the clean stage (targets: 1% ≥ "
                "0.8, 10% ≥ 0.6, RSS ≤ 1.3): " + ", ".join(cells)
            )
    return lines


def main() -> None:
    """The clean stages and the poison ones alone, on the embedded broker (Apicurio for Avro)."""
    import contextlib

    from rich.console import Console

    from ingest.kafka.embedded import EmbeddedBroker
    from tests.benchmarks import bench

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--formats", default="json,avro")
    parser.add_argument("--only", help="a comma-separated list of poison stages")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="runs of each poison stage, each beside a clean one")
    args = parser.parse_args()
    args.topic, args.tables_records, args.s3, args.registry = "bench", 0, None, None
    console = Console(stderr=True)
    formats = set(args.formats.split(","))
    for name in set(MATRIX) - set(args.only.split(",") if args.only else MATRIX):
        del MATRIX[name]
    avro = bench.registry_server(console) if "avro" in formats else contextlib.nullcontext(None)
    with EmbeddedBroker() as broker, avro as args.registry:
        args.bootstrap = broker.bootstrap_servers
        results = {}
        good = bench.clean_topics(args, formats, console)
        results["ingest"] = bench.run_stage("ingest", args)
        if "avro" in good:
            results["avro_ingest"] = bench.run_stage("avro_ingest", args)
        results |= run(
            args,
            set(good),
            good,
            lambda fmt, topic: bench.poison_topic(args, fmt, topic),
            bench.run_stage,
            console.print,
            args.pairs,
        )
    for name, result in results.items():
        workers = f" ({result['workers_peak_rss_mb']:,.0f} MB in workers)" if result.get("workers_peak_rss_mb") else ""
        console.print(f"{name}: {result['records_per_s']:,.0f} records/s, {result['peak_rss_mb']:,.0f} MB{workers}")
    for line in summary(results):
        console.print(line)
    bench.record("poison", args, results, ratios(results))


if __name__ == "__main__":
    main()
