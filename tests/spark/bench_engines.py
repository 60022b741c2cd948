"""Local engine against the Spark engine on one batch of the same records, each in a process of its own.

    python -m tests.spark.bench_engines [--records 2000000] [--partitions 4] [--master 'local[2]']

Starts the embedded broker, produces the order events once, then runs one batch of all of them
into a fresh table (SQLite catalog, partitioned by day) with each engine. For Spark it reports the
session start (JVM and SparkContext) and a warm-up batch (executors' Python workers start and
import the package) separately from the timed batch, which runs on the warm session. Each timed
figure covers ``Pipeline.run_batch``: planning, reading, decoding, writing and both commits.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

SCHEMA = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "customer_id", "type": "long", "required": True},
    {"name": "status", "type": "string"},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "currency", "type": "string"},
    {"name": "items", "type": "int"},
    {"name": "created_at", "type": "timestamptz", "required": True},
]


def _value(i: int) -> bytes:
    """~160-byte order event, as in conf/orders.yaml."""
    return json.dumps(
        {
            "order_id": i,
            "customer_id": i * 7919 % 100_000,
            "status": ("created", "paid", "shipped")[i % 3],
            "amount": f"{i % 900}.{i % 100:02d}",
            "currency": "EUR",
            "items": 1 + i % 7,
            "created_at": f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:{i % 60:02d}Z",
        }
    ).encode()


def _config(args: argparse.Namespace, name: str, topic: str) -> Path:
    data = {
        "pipeline": name,
        "kafka": {"bootstrap.servers": args.bootstrap},
        "topics": [topic],
        "catalog": {
            "name": "bench",
            "type": "sql",
            "uri": f"sqlite:///{args.workdir}/catalog.db",
            "warehouse": Path(args.workdir, "warehouse").as_uri(),
        },
        "table": f"bench.{name}",
        "schema": SCHEMA,
        "partition_by": ["day(created_at)"],
        "batch": {"max_records": args.records, "chunk_records": 200_000, "read_timeout_s": 60},
    }
    path = Path(args.workdir, f"{name}.yaml")
    path.write_text(yaml.safe_dump(data))
    return path


def _timed_batch(config_path: Path, engine: Any = None) -> dict[str, Any]:
    from ingest import config as config_module
    from ingest.pipeline import Pipeline

    pipeline = Pipeline.open(config_module.load(config_path))
    if callable(engine):
        engine = engine(pipeline)
    started = time.perf_counter()
    result = pipeline.run_batch(engine)
    seconds = time.perf_counter() - started
    records = result.records + result.dead_letters
    return {"records": records, "seconds": round(seconds, 2), "records_per_s": round(records / seconds)}


def stage_local(args: argparse.Namespace) -> dict[str, Any]:
    return {"engine": "local", **_timed_batch(_config(args, "local", args.topic))}


def stage_spark(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from ingest.spark import SparkEngine

    started = time.perf_counter()
    builder = SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
    for item in args.conf:
        key, value = item.split("=", 1)
        builder = builder.config(key, value)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    session_s = time.perf_counter() - started
    warmup = _timed_batch(_config(args, "warmup", args.warmup_topic), lambda p: SparkEngine.create(p, spark))
    timed = _timed_batch(_config(args, "spark", args.topic), lambda p: SparkEngine.create(p, spark))
    spark.stop()
    return {
        "engine": f"spark {args.master}",
        **timed,
        "session_start_s": round(session_s, 2),
        "warmup_batch_s": warmup["seconds"],
    }


def _stage(args: argparse.Namespace, name: str, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.spark.bench_engines", "--stage", name, "--bootstrap", args.bootstrap]
    command += ["--topic", args.topic, "--warmup-topic", args.warmup_topic, "--workdir", args.workdir]
    command += ["--records", str(args.records), "--master", args.master, *extra]
    for item in args.conf:
        command += ["--conf", item]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"stage {name} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE")
    parser.add_argument("--stage", choices=["local", "spark"])
    parser.add_argument("--bootstrap")
    parser.add_argument("--topic")
    parser.add_argument("--warmup-topic")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.stage:
        figures = stage_local(args) if args.stage == "local" else stage_spark(args)
        figures["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(figures))
        return

    from ingest.broker import EmbeddedBroker
    from ingest.kafka import create_topic, produce

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as workdir:
        args.bootstrap, args.workdir = broker.bootstrap_servers, workdir
        args.topic, args.warmup_topic = "bench-orders", "bench-warmup"
        create_topic(args.bootstrap, args.topic, args.partitions)
        create_topic(args.bootstrap, args.warmup_topic, args.partitions)
        started = time.perf_counter()
        produce(
            args.bootstrap,
            args.topic,
            ((i % args.partitions, b"k%d" % i, _value(i), None) for i in range(args.records)),
        )
        produce(
            args.bootstrap, args.warmup_topic, ((i % args.partitions, None, _value(i), None) for i in range(20_000))
        )
        print(f"produced {args.records} records in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        results = [_stage(args, "local", []), _stage(args, "spark", [])]
    for figures in results:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
