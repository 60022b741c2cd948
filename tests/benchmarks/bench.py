"""`make bench`: throughput and memory of every stage, measured in one run on the same data.

The orchestrator starts the embedded broker, produces the dataset once, and runs each stage in a
process of its own so that each stage's peak RSS is its own. Results are printed as a table,
written as JSON to stdout with ``--json``, and appended to ``tests/benchmarks/results.jsonl``.

    python -m tests.benchmarks.bench [--records 2000000] [--partitions 4] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.benchmarks import changelog, poison

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("results.jsonl")

SCHEMA: list[dict[str, Any]] = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "customer_id", "type": "long"},
    {"name": "status", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "created_at", "type": "timestamptz"},
]


#: the same order events as Avro (what the JSON payloads hold, typed)
AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer_id", "type": ["null", "long"]},
        {"name": "status", "type": ["null", "string"]},
        {"name": "amount", "type": ["null", "double"]},
        {"name": "created_at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    ],
}
AVRO_TOPIC = "-avro"


def avro_payloads(schema_id: int, n: int) -> list[bytes]:
    """The orders of :func:`payload` in the Confluent wire format, as confluent-kafka's
    AvroSerializer writes them (fastavro's encoder behind a zero byte and the schema id)."""
    import io
    import struct

    import fastavro

    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    prefix = struct.pack(">bI", 0, schema_id)
    out = []
    for i in range(n):
        buffer = io.BytesIO()
        buffer.write(prefix)
        record = json.loads(payload(i))
        record["created_at"] = datetime.fromisoformat(record["created_at"])
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


def payload(i: int) -> bytes:
    """~120-byte JSON order event."""
    return (
        b'{"order_id":%d,"customer_id":%d,"status":"%s","amount":%d.%02d,"created_at":"2026-11-%02dT10:%02d:%02dZ"}'
        % (
            i,
            i * 7919 % 100_000,
            (b"paid", b"shipped", b"created")[i % 3],
            i % 900,
            i % 100,
            1 + i % 28,
            i % 60,
            i % 60,
        )
    )


# --- stages (each runs in its own process) ---------------------------------------------------


#: messages per ``consume()`` of the raw stages: the fastest batch measured. With 100k a batch's
#: ``Message`` objects (~40 MB) filled fresh arenas of Python's allocator each time, which it had
#: handed back to the system when the previous batch was freed: 150k more page faults per 2M
#: records, counting ran at 1.36-1.58 s against 0.81-0.98 s with 10k (5k and 1k as fast as 10k).
RAW_CONSUME = 10_000


def stage_raw(args: argparse.Namespace) -> dict[str, Any]:
    """librdkafka consumption with the tuned fetch settings the pipeline uses, and no decoding;
    the cyclic garbage collector paused as in the pipeline (a ``Message`` per record)."""
    from confluent_kafka import Consumer

    from ingest import nogc
    from ingest.kafka.settings import FETCH_DEFAULTS

    consumer = Consumer(
        {"bootstrap.servers": args.bootstrap, "group.id": "bench-raw", "enable.auto.commit": False, **FETCH_DEFAULTS}
    )
    total = _assigned(consumer, args)
    count = nbytes = 0
    started = time.perf_counter()
    with nogc.paused():
        while count < total:
            # consume() returns when it has num_messages or its timeout passed: ask for no more than is left
            for message in consumer.consume(min(RAW_CONSUME, total - count), 1.0):
                count += 1
                value = message.value()
                assert value is not None  # (the benchmark's topics hold no tombstones)
                nbytes += len(value)
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": count, "bytes": nbytes, "seconds": seconds}


def _assigned(consumer: Any, args: argparse.Namespace) -> int:
    """Assign every partition of the topic from offset 0; how many records they hold (to their
    high watermarks: a reader that stops there waits for nothing at the end)."""
    from confluent_kafka import TopicPartition

    partitions = [TopicPartition(args.topic, p, 0) for p in range(args.partitions)]
    total = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions)
    consumer.assign(partitions)
    return int(total)


def stage_raw_count(args: argparse.Namespace) -> dict[str, Any]:
    """librdkafka with the pipeline's fetch settings, ``consume()`` in batches, the messages counted
    and never touched: the ceiling of reading in Python (it stops at the high watermarks)."""
    from confluent_kafka import Consumer

    from ingest import nogc
    from ingest.kafka.settings import FETCH_DEFAULTS

    consumer = Consumer(
        {"bootstrap.servers": args.bootstrap, "group.id": "bench-count", "enable.auto.commit": False, **FETCH_DEFAULTS}
    )
    total = _assigned(consumer, args)
    count = 0
    started = time.perf_counter()
    with nogc.paused():
        while count < total:
            count += len(consumer.consume(min(RAW_CONSUME, total - count), 1.0))
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": count, "bytes": sum(len(payload(i)) for i in range(count)), "seconds": seconds}


def stage_batch_loop(args: argparse.Namespace) -> dict[str, Any]:
    """What a competent engineer writes by hand: ``consume()`` in batches (librdkafka's defaults),
    ``json.loads`` per value, ``Table.from_pylist``, the timestamps parsed by Arrow, one pyiceberg
    ``append``. Timed from the first read to the append's end, as the ``naive`` loop is."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka import Consumer
    from pyiceberg.catalog.sql import SqlCatalog

    with tempfile.TemporaryDirectory() as tmp:
        catalog = SqlCatalog("loop", uri=f"sqlite:///{tmp}/c.db", warehouse=f"file://{tmp}")
        catalog.create_namespace("bench")
        fields = [("order_id", pa.int64()), ("customer_id", pa.int64()), ("status", pa.string())]
        fields += [("amount", pa.float64())]
        schema = pa.schema([*fields, ("created_at", pa.timestamp("us", tz="UTC"))])
        text = pa.schema([*fields, ("created_at", pa.string())])
        table = catalog.create_table("bench.loop", schema=schema)
        consumer = Consumer(
            {"bootstrap.servers": args.bootstrap, "group.id": "bench-loop", "enable.auto.commit": False}
        )
        total = _assigned(consumer, args)
        started = time.perf_counter()
        records: list[dict[str, Any]] = []
        nbytes = 0
        while len(records) < total:  # to the high watermarks, asking for no more than is left
            for message in consumer.consume(min(10_000, total - len(records)), 1.0):
                value = message.value()
                assert value is not None  # (the benchmark's topics hold no tombstones)
                nbytes += len(value)
                records.append(json.loads(value))
        data = pa.Table.from_pylist(records, schema=text)
        moments = pc.assume_timezone(pc.strptime(data["created_at"], "%Y-%m-%dT%H:%M:%SZ", "us"), "UTC")
        table.append(data.set_column(4, "created_at", moments).cast(schema))
        seconds = time.perf_counter() - started
        consumer.close()
    return {"records": len(records), "bytes": nbytes, "seconds": seconds}


def stage_spawn(args: argparse.Namespace) -> dict[str, Any]:
    """``ingest run --until-caught-up`` as a scheduler runs it, timed from spawn to exit: all the
    records into new tables; then the same command again with nothing new (``caught_up_s``); then
    half the records (the first half of each partition) into other new tables (``half_s``), read
    for a consumer group of their own, as the first run's was (the group's offsets decide whether
    workers start before the catalog opens)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(json.dumps(_config(args, tmp)))  # JSON is YAML
        seconds, peak = _spawned(path)
        caught_up_s, _ = _spawned(path)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "half.yaml"
        config = _config(args, tmp)
        config["kafka"]["group.id"] = "ingest-bench-half"
        config["batch"]["max_records"] = args.records // 2
        path.write_text(json.dumps(config))
        half_s, _ = _spawned(path, "--max-batches", "1")
    return {
        "records": args.records,
        "bytes": sum(len(payload(i)) for i in range(args.records)),
        "seconds": seconds,
        "caught_up_s": caught_up_s,
        "half_s": half_s,
        "children_peak_rss_mb": peak,
    }


def stage_small(args: argparse.Namespace) -> dict[str, Any]:
    """``ingest run --until-caught-up`` of a 10,000-record topic, spawn to exit, into new tables."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(json.dumps(_config(args, tmp) | {"topics": [args.topic + SMALL_TOPIC]}))
        seconds, _ = _spawned(path)
    return {"records": SMALL_RECORDS, "bytes": SMALL_RECORDS * len(payload(0)), "seconds": seconds}


#: the ``small`` stage's topic (after ``--topic``) and its records
SMALL_TOPIC, SMALL_RECORDS = "-small", 10_000


def _spawned(path: Path, *options: str) -> tuple[float, float]:
    """Wall seconds of ``ingest run --until-caught-up -c path`` (and ``options``), spawn to exit,
    and the peak RSS (MB) of the largest process it ran."""
    command = [sys.executable, "-m", "ingest", "run", "--until-caught-up", *options, "-c", str(path)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ingest run failed:\n{done.stderr}")
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _values(n: int) -> list[bytes]:
    return [payload(i) for i in range(n)]


def stage_decode(args: argparse.Namespace) -> dict[str, Any]:
    """The project's Arrow decoder alone, on the same payloads, in chunks as the engine uses."""
    from ingest.config import FieldSpec
    from ingest.formats.json import Decoder

    decoder = Decoder([FieldSpec(**f) for f in SCHEMA])
    return _decode_in_chunks(decoder, _values(args.records))


def _decode_in_chunks(decoder: Any, values: list[bytes]) -> dict[str, Any]:
    """``decoder`` alone on ``values``, in chunks of 200,000 as the engine hands them over."""
    import pyarrow as pa

    from ingest.records import RawChunk

    chunk = 200_000
    started = time.perf_counter()
    rows = 0
    for lo in range(0, len(values), chunk):
        part: list[bytes | None] = list(values[lo : lo + chunk])
        n = len(part)
        raw = RawChunk(
            topic=pa.array(["bench"] * n),
            partition=pa.array([0] * n, pa.int32()),
            offset=pa.array(range(lo, lo + n), pa.int64()),
            timestamp=pa.nulls(n, pa.timestamp("us", tz="UTC")),
            key=pa.nulls(n, pa.binary()),
            values=part,
            headers=lambda i: None,
            nbytes=0,
        )
        rows += decoder.decode(raw).rows.num_rows
    seconds = time.perf_counter() - started
    return {"records": rows, "bytes": sum(map(len, values)), "seconds": seconds}


def stage_parquet(args: argparse.Namespace) -> dict[str, Any]:
    """pyarrow Parquet writing (zstd) of the decoded rows alone."""
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    values = _values(args.records)
    table = pj.read_json(pa.py_buffer(b"\n".join(values)))
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        pq.write_table(table, f"{tmp}/bench.parquet", compression="zstd")
        seconds = time.perf_counter() - started
    return {"records": table.num_rows, "bytes": sum(map(len, values)), "seconds": seconds}


def stage_naive(args: argparse.Namespace) -> dict[str, Any]:
    """What a user writes by hand: per-record json.loads, Table.from_pylist, pyiceberg append."""
    from datetime import datetime as dt

    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition
    from pyiceberg.catalog.sql import SqlCatalog

    with tempfile.TemporaryDirectory() as tmp:
        catalog = SqlCatalog("naive", uri=f"sqlite:///{tmp}/c.db", warehouse=f"file://{tmp}")
        catalog.create_namespace("bench")
        schema = pa.schema(
            [
                ("order_id", pa.int64()),
                ("customer_id", pa.int64()),
                ("status", pa.string()),
                ("amount", pa.float64()),
                ("created_at", pa.timestamp("us", tz="UTC")),
            ]
        )
        table = catalog.create_table("bench.naive", schema=schema)
        consumer = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": "bench-naive",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        consumer.assign([TopicPartition(args.topic, p, 0) for p in range(args.partitions)])
        started = time.perf_counter()
        records: list[dict[str, Any]] = []
        nbytes = eof = 0
        while eof < args.partitions:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                eof += 1
                continue
            value = message.value()
            assert value is not None  # (the benchmark's topics hold no tombstones)
            nbytes += len(value)
            record = json.loads(value)
            record["created_at"] = dt.fromisoformat(record["created_at"])
            records.append(record)
        table.append(pa.Table.from_pylist(records, schema=schema))
        seconds = time.perf_counter() - started
        consumer.close()
    return {"records": len(records), "bytes": nbytes, "seconds": seconds}


def stage_avro_decode(args: argparse.Namespace) -> dict[str, Any]:
    """The project's Avro decoder alone, on the same orders as Avro values, in chunks as the engine uses."""

    from ingest.formats.avro import AvroDecoder
    from ingest.formats.avro_schema import record_fields
    from ingest.kafka.registry import Registry

    registry = Registry({"url": args.registry})
    writer = registry.latest(args.topic + AVRO_TOPIC + "-value")
    decoder = AvroDecoder(record_fields(writer.text), registry, "evolve")
    values = avro_payloads(writer.schema_id, args.records)
    return _decode_in_chunks(decoder, values)


def stage_avro_naive(args: argparse.Namespace) -> dict[str, Any]:
    """The hand-written Avro loop: confluent-kafka's AvroDeserializer per record (schemas from the
    registry), Table.from_pylist, pyiceberg append."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyiceberg.catalog.sql import SqlCatalog

    topic = args.topic + AVRO_TOPIC
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": args.registry, "timeout": 10}))
    context = SerializationContext(topic, MessageField.VALUE)
    schema = pa.schema(
        [
            pa.field("order_id", pa.int64(), nullable=False),
            ("customer_id", pa.int64()),
            ("status", pa.string()),
            ("amount", pa.float64()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        catalog = SqlCatalog("naive", uri=f"sqlite:///{tmp}/c.db", warehouse=f"file://{tmp}")
        catalog.create_namespace("bench")
        table = catalog.create_table("bench.naive", schema=schema)
        consumer = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": "bench-avro-naive",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
        started = time.perf_counter()
        records: list[dict[str, Any]] = []
        nbytes = eof = 0
        while eof < args.partitions:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                eof += 1
                continue
            value = message.value()
            assert value is not None  # (the benchmark's topics hold no tombstones)
            nbytes += len(value)
            records.append(deserializer(value, context))
        table.append(pa.Table.from_pylist(records, schema=schema))
        seconds = time.perf_counter() - started
        consumer.close()
    return {"records": len(records), "bytes": nbytes, "seconds": seconds}


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak RSS (``VmHWM``: since its exec, unlike ``ru_maxrss``, which Linux carries
    across ``execve`` from the process that forked it), MB; 0 if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0.0)


def _workers_peak_rss_mb() -> float:
    """Peak RSS of this process's running children (the local engine's workers), summed: read
    before the run closes them."""
    pids = [pid for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]
    return sum(peak_rss_mb(pid) for pid in pids)


def stage_ingest(args: argparse.Namespace) -> dict[str, Any]:
    """`ingest run` with the local engine, in a new process: one batch of all records (plan,
    read, decode, write, commit), timed as the Spark and scaling stages are. What comes before the
    batch is reported apart (``open_s``), as ``ingest run`` does it: asking Kafka for the backlog,
    starting the worker, importing pyiceberg and opening the catalog while the worker imports, and
    creating the tables. Peak RSS counts the workers too."""
    return _ingest(args, {})


def stage_ingest_s3(args: argparse.Namespace) -> dict[str, Any]:
    """`ingest` as the ``ingest`` stage, its warehouse (data and metadata) in a bucket of moto's S3
    server over HTTP, the SQLite catalog the same."""
    catalog = {"name": "bench", "type": "sql", "warehouse": f"s3://lake/{uuid.uuid4().hex}", **json.loads(args.s3)}
    return _ingest(args, {"catalog": catalog}, keep_uri=True)


def stage_ingest_rest_s3(args: argparse.Namespace) -> dict[str, Any]:
    """`ingest` as the ``ingest_s3`` stage, through Iceberg's REST catalog server (its JDBC store in
    SQLite) instead of the SQLite catalog: the commits go over HTTP too."""
    catalog = {"name": "bench", "type": "rest", "uri": args.rest, **json.loads(args.s3)}
    return _ingest(args, {"catalog": catalog, "table": f"bench{uuid.uuid4().hex[:8]}.orders"})


def stage_poison(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """`ingest` as the ``ingest`` stage (or ``avro_ingest`` for Avro), on the same orders with
    poison records of one kind among them (:mod:`tests.benchmarks.poison`): each one a dead letter."""
    stage = poison.MATRIX[name]
    return _ingest(args, stage.overrides(stage.topic(args.topic), args.registry))


def stage_avro_ingest(args: argparse.Namespace) -> dict[str, Any]:
    """`ingest` as the ``ingest`` stage, on the same orders as Avro values through the registry,
    the table's schema derived from the subject."""
    return _ingest(args, _avro(args))


def _avro(args: argparse.Namespace) -> dict[str, Any]:
    topic = args.topic + AVRO_TOPIC
    return {
        "topics": [{"name": topic, "format": "avro"}],
        "schema_registry": {"url": args.registry},
        "schema": None,
    }


#: the ``route_by`` stage: each order into the table of its status (paid, shipped, created)
ROUTED = {"table": None, "route_by": {"field": "status", "table": "bench.orders_{value}"}}


def stage_route_by(args: argparse.Namespace) -> dict[str, Any]:
    """`ingest` as the ``ingest`` stage, each record routed by its ``status`` into one of three
    tables (``route_by``), the tables there already (a table's first batch reads its records twice:
    once to find it missing): three floors read, three tables committed, then the ledger."""
    return _ingest(args, ROUTED, routed=("paid", "shipped", "created"))


def _ingest(
    args: argparse.Namespace, overrides: dict[str, Any], keep_uri: bool = False, routed: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``keep_uri``: the overriding catalog keeps the stage's SQLite catalog file; ``routed``: the
    values of ``route_by`` whose tables are created before the batch."""
    from ingest import config as config_module
    from ingest.engines.local import processes as local_processes
    from ingest.runner import opened  # imports no pyiceberg

    with tempfile.TemporaryDirectory() as tmp:
        data = _config(args, tmp) | overrides
        if keep_uri:
            data["catalog"]["uri"] = _config(args, tmp)["catalog"]["uri"]
        config = config_module.parse({k: v for k, v in data.items() if v is not None})
        started = time.perf_counter()
        with opened(config) as run:
            if run.pipeline.routes is not None:
                assert config.route_by is not None
                run.pipeline.routes.create([config.route_by.table_of(v) for v in routed], run.pipeline.fields)
            open_s = time.perf_counter() - started
            started = time.perf_counter()
            result = run.batch()
            seconds = time.perf_counter() - started
            processes = local_processes(config, sum(end - start for *_, start, end in result.ranges))
            workers_mb = _workers_peak_rss_mb()
    return {
        "records": result.records + result.dead_letters,
        "dead_letters": result.dead_letters,
        "bytes": result.bytes,
        "seconds": seconds,
        "open_s": open_s,
        "processes": processes,
        "children_peak_rss_mb": workers_mb,
    }


def stage_catchup(args: argparse.Namespace) -> dict[str, Any]:
    """A catch-up of two batches on one local engine: the first starts the workers, the second
    (timed) finds them running, as every later batch of ``ingest run --until-caught-up`` does."""
    from ingest import config as config_module
    from ingest.assembly import open_pipeline
    from ingest.engines.local import processes as local_processes
    from ingest.runner import engine_for

    half = args.records // 2
    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"batch": {"max_records": half, "chunk_records": max(1, half // 2)}}
        config = config_module.parse(_config(args, tmp) | overrides)
        with engine_for(open_pipeline(config)) as run:
            started = time.perf_counter()
            run.batch()
            first_s = time.perf_counter() - started
            started = time.perf_counter()
            result = run.batch()
            seconds = time.perf_counter() - started
            processes = local_processes(config, half)
            workers_mb = _workers_peak_rss_mb()
    return {
        "records": result.records + result.dead_letters,
        "bytes": result.bytes,
        "seconds": seconds,
        "first_batch_s": first_s,
        "processes": processes,
        "children_peak_rss_mb": workers_mb,
    }


def stage_spark(args: argparse.Namespace) -> dict[str, Any]:
    """The Spark engine (``local[2]``) on a warm session: one batch of all records, end to end.

    Session start (JVM, SparkContext) and a warm-up batch (executors' Python workers start and
    import the package) are reported apart from the timed batch. Peak RSS is the driver's only.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from ingest import config as config_module
    from ingest.runner import opened

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        warmup = config_module.parse(_config(args, tmp) | {"topics": [args.topic + "-warmup"]})
        started = time.perf_counter()
        with opened(warmup, "spark", spark=spark) as run:
            run.batch()
        warmup_s = time.perf_counter() - started
        with opened(config_module.parse(_config(args, tmp) | {"table": "bench.spark"}), "spark", spark=spark) as run:
            started = time.perf_counter()
            result = run.batch()
            seconds = time.perf_counter() - started
    spark.stop()
    return {
        "records": result.records + result.dead_letters,
        "bytes": result.bytes,
        "seconds": seconds,
        "session_start_s": session_s,
        "warmup_batch_s": warmup_s,
    }


def spark_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyspark") is not None


def _config(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    return {
        "pipeline": "bench",
        "kafka": {"bootstrap.servers": args.bootstrap},
        "topics": [args.topic],
        "catalog": {"name": "bench", "type": "sql", "uri": f"sqlite:///{tmp}/c.db", "warehouse": f"file://{tmp}"},
        "table": "bench.orders",
        "schema": SCHEMA,
        "batch": {"max_records": args.records},
    }


def stage_fixed(args: argparse.Namespace) -> dict[str, Any]:
    """Per-batch cost that does not depend on records, against the number of snapshots.

    The table is grown with ledger-bearing snapshots through the real commit path (no data files),
    then batches of one record per partition are timed end to end (plan, ledger lookup, read,
    write, commit).
    """
    import statistics

    from ingest import config as config_module
    from ingest.assembly import open_pipeline
    from ingest.committer import RowsCommit, commit_rows
    from ingest.core.ledger import BatchCounts
    from ingest.core.plan import Batch
    from ingest.kafka.admin import produce
    from tests.runs import one_batch

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = config_module.parse(_config(args, tmp) | {"topics": [args.topic + "-fixed"]})
        pipeline = open_pipeline(config)
        one_batch(pipeline)  # pins the ledger
        for target in (10, 100, 1000):
            while len(pipeline.rows.table.metadata.snapshots) < target:
                found = pipeline.ledger()
                assert found is not None
                led = found.ledger
                batch = Batch(led.batch + 1, led, led.offsets, led.offsets, led.cluster_id)
                nxt = batch.ledger(led.timestamps)
                commit_rows(pipeline.rows, RowsCommit("bench", batch, nxt, [], BatchCounts(), 8))
            timings = []
            for _ in range(5):
                produce(args.bootstrap, args.topic + "-fixed", ((p, None, payload(p), None) for p in range(4)))
                started = time.perf_counter()
                one_batch(pipeline)
                timings.append(time.perf_counter() - started)
            results[str(target)] = statistics.median(timings)
    return {"records": 1, "bytes": 0, "seconds": 1.0, "per_batch_s": results}


def stage_scaling(args: argparse.Namespace) -> dict[str, Any]:
    """Local-engine throughput against batch size, on the same topic."""
    from ingest import config as config_module
    from ingest.assembly import open_pipeline
    from tests.runs import one_batch

    sizes = [s for s in (10_000, 100_000, 500_000, 2_000_000) if s <= args.records]
    rates = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            config = config_module.parse(_config(args, tmp) | {"batch": {"max_records": size}})
            pipeline = open_pipeline(config)
            started = time.perf_counter()
            result = one_batch(pipeline)
            rates[str(size)] = (result.records + result.dead_letters) / (time.perf_counter() - started)
    return {"records": 1, "bytes": 0, "seconds": 1.0, "records_per_s_by_batch_size": rates}


def _one_per_partition(bootstrap: str, topics: list[str], partitions: int, start: int) -> None:
    """One record into each partition of ``topics``, through one producer."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, topic in enumerate(topics):
        for partition in range(partitions):
            producer.produce(topic, value=payload(start + i * partitions + partition), partition=partition)
    assert producer.flush(60) == 0


def _topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1) for name in names]).values():
        future.result(120)


def stage_partitions(args: argparse.Namespace) -> dict[str, Any]:
    """Per-batch fixed cost against the partitions one pipeline reads: 10, 100 and 1,000 (2, 20 and
    200 topics of 5 partitions, chosen by ``topics_pattern``), on one open run as ``--every`` keeps it.

    Timed: a batch with one new record in every partition (plan: Kafka's metadata and offsets, the
    ledger lookup; read, write, commit), and a caught-up batch (nothing new: plan only). Reported
    too: the ledger's size in the snapshot summary and the table's metadata file after 25 batches.
    """
    import statistics

    from ingest import config as config_module
    from ingest.core.ledger_codec import ours
    from ingest.runner import opened

    results: dict[str, Any] = {}
    for count in (10, 100, 1000):
        prefix = f"{args.topic}-p{count}-{uuid.uuid4().hex[:6]}-"
        topics = [f"{prefix}{i:03d}" for i in range(count // 5)]
        _topics(args.bootstrap, topics, 5)
        _one_per_partition(args.bootstrap, topics, 5, 0)
        with tempfile.TemporaryDirectory() as tmp:
            data = _config(args, tmp) | {"topics_pattern": prefix + ".*", "table": f"bench.p{count}"}
            del data["topics"]
            with opened(config_module.parse(data)) as run:
                run.batch()
                timed, empty = [], []
                for i in range(1, 25):
                    started = time.perf_counter()
                    assert run.batch().status == "empty"
                    empty.append(time.perf_counter() - started)
                    _one_per_partition(args.bootstrap, topics, 5, i * count)
                    started = time.perf_counter()
                    result = run.batch()
                    timed.append(time.perf_counter() - started)
                    assert result.records == count, result
                table = run.pipeline.rows.table.refresh()
                head_summary = table.metadata.snapshots[-1].summary
                assert head_summary is not None
                summary = head_summary.additional_properties
                ledger_bytes = sum(len(k) + len(v) for k, v in ours(summary).items())
                metadata_bytes = Path(table.metadata_location.removeprefix("file://")).stat().st_size
        results[str(count)] = {
            "batch_s": statistics.median(timed),
            "caught_up_s": statistics.median(empty),
            "ledger_bytes": ledger_bytes,
            "metadata_bytes_after_25": metadata_bytes,
        }
    return {"records": 1, "bytes": 0, "seconds": 1.0, "by_partitions": results}


def stage_tables(args: argparse.Namespace) -> dict[str, Any]:
    """``ingest run --until-caught-up`` of a config of 50 tables (``tables:``, a topic of 2
    partitions each), spawn to exit as a scheduler runs it: the catch-up of the whole backlog
    (``--tables-records``, 20M by default), then a run with nothing new. Peak RSS is the largest
    process's (the run or a worker), against the budget of one batch (4 × its payload + 400 MB)."""
    from ingest.core.plan import PlanPolicy

    with tempfile.TemporaryDirectory() as tmp:
        data = _config(args, tmp)
        for key in ("topics", "table", "schema", "batch"):
            del data[key]
        data["tables"] = [
            {"table": f"bench.t{i:02d}", "topics": [f"{args.topic}{TABLES_TOPIC}{i:02d}"], "schema": SCHEMA}
            for i in range(TABLES)
        ]
        path = Path(tmp, "tables.yaml")
        path.write_text(json.dumps(data))  # YAML is a superset of JSON
        command = [sys.executable, "-m", "ingest", "run", "--until-caught-up", "--json", "-c", str(path)]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600)
        seconds = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        started = time.perf_counter()
        again = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
        caught_up_s = time.perf_counter() - started
        assert again.returncode == 0, again.stderr[-3000:]
    records = sum(line["records"] + line["dead_letters"] for line in lines)
    nbytes = sum(line["bytes"] for line in lines)
    batch_mb = PlanPolicy().max_records * nbytes / max(1, records) / 1e6  # the default batch's payload
    return {
        "records": records,
        "bytes": nbytes,
        "seconds": seconds,
        "tables": len({line["table"] for line in lines}),
        "batches": len(lines),
        "caught_up_s": caught_up_s,
        "largest_process_peak_rss_mb": peak_mb,
        "batch_budget_mb": 4 * batch_mb + 400,
    }


#: tables of the ``tables`` stage, a topic each (named ``<topic><TABLES_TOPIC><nn>``, 2 partitions)
TABLES, TABLES_TOPIC = 50, "-tbl-"


STAGES = {
    "raw": stage_raw,
    "decode": stage_decode,
    "parquet": stage_parquet,
    "naive": stage_naive,
    "ingest": stage_ingest,
    "catchup": stage_catchup,
    "spark": stage_spark,
    "avro_decode": stage_avro_decode,
    "avro_naive": stage_avro_naive,
    "avro_ingest": stage_avro_ingest,
    "ingest_s3": stage_ingest_s3,
    "ingest_rest_s3": stage_ingest_rest_s3,
    "fixed": stage_fixed,
    "scaling": stage_scaling,
    "partitions": stage_partitions,
    "tables": stage_tables,
    "route_by": stage_route_by,
    "raw_count": stage_raw_count,
    "batch_loop": stage_batch_loop,
    "spawn": stage_spawn,
    "small": stage_small,
}
STAGES |= {name: functools.partial(stage_poison, name) for name in poison.MATRIX}
STAGES |= changelog.STAGES


def record(suite: str, args: argparse.Namespace, results: dict[str, Any], ratios: dict[str, float]) -> None:
    """Append the report of a suite run alone (``python -m tests.benchmarks.<suite>``) to ``results.jsonl``."""
    report = {
        "when": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "suite": suite,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "partitions": args.partitions,
        "stages": results,
        "ratios": ratios,
    }
    with RESULTS.open("a") as out:
        out.write(json.dumps(report) + "\n")


def run_stage(name: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "tests.benchmarks.bench",
        "--stage",
        name,
        "--bootstrap",
        args.bootstrap,
        "--topic",
        args.topic,
        "--records",
        str(args.records),
        "--partitions",
        str(args.partitions),
        "--tables-records",
        str(args.tables_records),
        *(["--registry", args.registry] if args.registry else []),
        *(["--s3", args.s3, "--rest", args.rest] if args.s3 else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"stage {name} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["records_per_s"] = result["records"] / result["seconds"]
    result["mb_per_s"] = result["bytes"] / result["seconds"] / 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=int(os.environ.get("BENCH_RECORDS", 2_000_000)))
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--tables-records",
        type=int,
        default=int(os.environ.get("BENCH_TABLES_RECORDS", 0)),
        help="records of the 50-table catch-up (default: 10 × --records)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--stage", choices=sorted(STAGES))
    parser.add_argument("--bootstrap")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--registry", help="the Schema Registry's URL (the Avro stages)")
    parser.add_argument("--s3", help="pyiceberg's S3 properties, as JSON (the S3 stages)")
    parser.add_argument("--rest", help="the REST catalog's URI (the REST stage)")
    args = parser.parse_args()
    args.tables_records = args.tables_records or 10 * args.records
    if args.stage:
        result = STAGES[args.stage](args)
        result["workers_peak_rss_mb"] = result.pop("children_peak_rss_mb", 0.0)
        result["peak_rss_mb"] = peak_rss_mb() + result["workers_peak_rss_mb"]
        print(json.dumps(result))
        return
    orchestrate(args)


def orchestrate(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from ingest.kafka.admin import create_topic, produce
    from ingest.kafka.embedded import EmbeddedBroker

    console = Console(stderr=True)
    with EmbeddedBroker() as broker, registry_server(console) as registry:
        args.bootstrap = broker.bootstrap_servers
        args.registry = registry
        good = clean_topics(args, {"json", "avro"}, console)
        create_topic(args.bootstrap, args.topic + "-fixed", 4)
        create_topic(args.bootstrap, args.topic + SMALL_TOPIC, args.partitions)
        produce(
            args.bootstrap,
            args.topic + SMALL_TOPIC,
            ((i % args.partitions, None, payload(i), None) for i in range(SMALL_RECORDS)),
        )
        stages = ["raw_count", "raw", "batch_loop", "naive", "spawn", "small", "ingest", "catchup", "route_by"]
        stages += ["decode", "parquet"]
        if spark_installed():
            stages.append("spark")
            create_topic(args.bootstrap, args.topic + "-warmup", args.partitions)
            produce(args.bootstrap, args.topic + "-warmup", ((i % 4, None, payload(i), None) for i in range(20_000)))
        else:
            console.print("Spark engine not measured: pip install 'lakehouse-ingest[spark]'")
        if "avro" in good:
            stages += ["avro_decode", "avro_naive", "avro_ingest"]
        results = {}
        for name in stages:
            results[name] = run_stage(name, args)
            console.print(f"{name}: {results[name]['records_per_s']:,.0f} records/s")
        results |= poison.run(
            args, set(good), good, lambda fmt, topic: poison_topic(args, fmt, topic), run_stage, console.print
        )
        changelog.produce_topics(args, console.print)
        results |= changelog.run(args, run_stage)
        with _s3_and_rest(console) as storage:  # up only for their stages, not beside the others
            if storage is not None:
                args.s3, args.rest = storage
                for name in ("ingest_s3", "ingest_rest_s3"):
                    results[name] = run_stage(name, args)
                    console.print(f"{name}: {results[name]['records_per_s']:,.0f} records/s")
        fixed = run_stage("fixed", args)["per_batch_s"]
        scaling = run_stage("scaling", args)["records_per_s_by_batch_size"]
        by_partitions = run_stage("partitions", args)["by_partitions"]
        started = time.perf_counter()
        _topics(args.bootstrap, [f"{args.topic}{TABLES_TOPIC}{i:02d}" for i in range(TABLES)], 2)
        for i in range(TABLES):  # the backlog of the 50-table catch-up, spread evenly
            share = args.tables_records // TABLES + (i < args.tables_records % TABLES)
            produce(
                args.bootstrap,
                f"{args.topic}{TABLES_TOPIC}{i:02d}",
                ((j % 2, None, payload(j), None) for j in range(share)),
            )
        console.print(
            f"produced {args.tables_records:,} records into {TABLES} topics in {time.perf_counter() - started:.1f}s"
        )
        tables = run_stage("tables", args)
    payload_mb = results["raw"]["bytes"] / 1e6
    report = {
        "when": datetime.now(tz=UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "partitions": args.partitions,
        "payload_mb": payload_mb,
        "stages": results,
        "fixed_cost_s_by_snapshots": fixed,
        "records_per_s_by_batch_size": scaling,
        "fixed_cost_by_partitions": by_partitions,
        "tables": tables,
        "ratios": {
            # spawn to exit, as a scheduler sees it, against the ceilings and a competent hand-written loop
            "run_vs_raw_count": results["spawn"]["records_per_s"] / results["raw_count"]["records_per_s"],
            "run_half_vs_raw_count": (args.records // 2 / results["spawn"]["half_s"])
            / results["raw_count"]["records_per_s"],
            "run_vs_batch_loop": results["spawn"]["records_per_s"] / results["batch_loop"]["records_per_s"],
            "batch_loop_vs_naive": results["batch_loop"]["records_per_s"] / results["naive"]["records_per_s"],
            "ingest_vs_raw": results["ingest"]["records_per_s"] / results["raw"]["records_per_s"],
            "ingest_vs_naive": results["ingest"]["records_per_s"] / results["naive"]["records_per_s"],
            "ingest_rss_vs_budget": results["ingest"]["peak_rss_mb"] / (4 * payload_mb + 400),
            "catchup_vs_raw": results["catchup"]["records_per_s"] / results["raw"]["records_per_s"],
            "catchup_vs_naive": results["catchup"]["records_per_s"] / results["naive"]["records_per_s"],
            "catchup_rss_vs_budget": results["catchup"]["peak_rss_mb"] / (4 * results["catchup"]["bytes"] / 1e6 + 400),
            "route_by_vs_ingest": results["route_by"]["records_per_s"] / results["ingest"]["records_per_s"],
        },
    }
    report["ratios"] |= poison.ratios(results) | changelog.ratios(results)
    if "avro_ingest" in results:
        report["ratios"] |= {
            "avro_ingest_vs_ingest": results["avro_ingest"]["records_per_s"] / results["ingest"]["records_per_s"],
            "avro_ingest_vs_avro_naive": results["avro_ingest"]["records_per_s"]
            / results["avro_naive"]["records_per_s"],
        }
    if "ingest_s3" in results:
        report["ratios"] |= {
            f"{name}_vs_ingest": results[name]["records_per_s"] / results["ingest"]["records_per_s"]
            for name in ("ingest_s3", "ingest_rest_s3")
        }
    if "spark" in results:
        report["ratios"] |= {
            "spark_vs_raw": results["spark"]["records_per_s"] / results["raw"]["records_per_s"],
            "spark_vs_naive": results["spark"]["records_per_s"] / results["naive"]["records_per_s"],
        }
    table = Table(title=f"{args.records:,} records, {args.partitions} partitions, {payload_mb:.0f} MB payload")
    for column in ("stage", "records/s", "MB/s", "peak RSS MB"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        label = {
            "ingest": f"ingest ({r.get('processes')} processes, started by the run)",
            "catchup": f"ingest, 2nd batch of a catch-up ({r.get('processes')} processes, running)",
            "avro_ingest": f"ingest, Avro values ({r.get('processes')} processes, started by the run)",
            "ingest_s3": f"ingest, warehouse on S3 (moto), SQLite catalog ({r.get('processes')} processes)",
            "ingest_rest_s3": f"ingest, warehouse on S3 (moto), REST catalog ({r.get('processes')} processes)",
            "raw_count": "raw librdkafka, tuned fetch, consume() batches, messages counted, untouched",
            "raw": "raw librdkafka, tuned fetch, each value's length read",
            "batch_loop": "hand-written batch loop (consume(), json.loads, from_pylist, one append)",
            "naive": "hand-written per-record loop (poll(), json.loads, fromisoformat, one append)",
            "spawn": "`ingest run --until-caught-up`, spawn to exit, new tables",
            "small": f"`ingest run`, {SMALL_RECORDS:,} records, spawn to exit",
            "route_by": f"ingest, route_by status into 3 tables ({r.get('processes')} processes)",
            "changelog": f"changelog, {r.get('rows_before', 0):,}-row table, Debezium changes in one batch",
            "changelog_append": "appends of as many orders in one batch (the changelog's twin)",
            "changelog_4x": "changelog, the 4× table (see the summary)",
        }.get(name, poison.MATRIX[name].label if name in poison.MATRIX else name)
        table.add_row(label, f"{r['records_per_s']:,.0f}", f"{r['mb_per_s']:.1f}", f"{r['peak_rss_mb']:.0f}")
    console.print(table)
    ratios = report["ratios"]
    spawn = results["spawn"]
    console.print(
        f"ingest run, spawn to exit: / tuned raw (untouched) = {ratios['run_vs_raw_count']:.2f} (target ≥ 0.5), "
        f"{args.records // 2:,} records {ratios['run_half_vs_raw_count']:.2f} ({spawn['half_s']:.2f}s); "
        f"/ hand-written batch loop = {ratios['run_vs_batch_loop']:.1f}× (target ≥ 4); the batch loop / the "
        f"per-record loop = {ratios['batch_loop_vs_naive']:.1f}×; a run with nothing new "
        f"{spawn['caught_up_s']:.2f}s (target ≤ 1); {SMALL_RECORDS:,} records {results['small']['seconds']:.2f}s "
        "(target ≤ 1.5)"
    )
    console.print(
        f"ingest / raw = {ratios['ingest_vs_raw']:.2f} (target ≥ 0.50); ingest / naive = "
        f"{ratios['ingest_vs_naive']:.1f}× (target ≥ 6); RSS / (4×payload + 400 MB) = "
        f"{ratios['ingest_rss_vs_budget']:.2f} (target ≤ 1); before the batch, ingest run took "
        f"{results['ingest']['open_s']:.2f}s more (the backlog, the worker's start, pyiceberg, the catalog)"
    )
    console.print(
        f"catch-up, second batch of {results['catchup']['records']:,} on running workers: / raw = "
        f"{ratios['catchup_vs_raw']:.2f}, / naive = {ratios['catchup_vs_naive']:.1f}×, RSS / (4×payload + 400 MB) "
        f"= {ratios['catchup_rss_vs_budget']:.2f} (target ≤ 1)"
    )
    console.print(
        f"route_by, one batch into 3 tables by a field's value / one table = {ratios['route_by_vs_ingest']:.2f}"
    )
    for line in poison.summary(results):
        console.print(line)
    console.print(changelog.summary(results))
    if "spark" in results:
        spark = results["spark"]
        console.print(
            f"spark local[2] (warm session; driver RSS only): spark / raw = {ratios['spark_vs_raw']:.2f}, "
            f"spark / naive = {ratios['spark_vs_naive']:.1f}×; session start {spark['session_start_s']:.1f}s, "
            f"warm-up batch {spark['warmup_batch_s']:.1f}s"
        )
    if "ingest_s3" in results:
        console.print(
            f"S3 (moto, one Python process on this machine): ingest on S3 / on the local disk = "
            f"{ratios['ingest_s3_vs_ingest']:.2f} (SQLite catalog), {ratios['ingest_rest_s3_vs_ingest']:.2f} "
            f"(REST catalog); before the batch {results['ingest_s3']['open_s']:.2f}s and "
            f"{results['ingest_rest_s3']['open_s']:.2f}s"
        )
    else:
        console.print("S3 not measured: moto's S3 server or the REST catalog server could not run (see above)")
    if "avro_ingest" in results:
        console.print(
            f"Avro: ingest (Avro) / ingest (JSON) = {ratios['avro_ingest_vs_ingest']:.2f} (target ≥ 0.70); "
            f"ingest (Avro) / naive Avro loop = {ratios['avro_ingest_vs_avro_naive']:.1f}× (target ≥ 5)"
        )
    else:
        console.print("Avro not measured: no Schema Registry could run (see above)")
    console.print(
        "per-batch fixed cost by snapshots in the table: "
        + ", ".join(f"{n}: {s * 1000:.0f} ms" for n, s in fixed.items())
        + " (target ≤ 250 ms at 1,000)"
    )
    console.print("records/s by batch size: " + ", ".join(f"{n}: {r:,.0f}" for n, r in scaling.items()))
    console.print(
        "per-batch fixed cost by partitions read (one new record each; caught up; ledger in the summary; "
        "metadata file after 25 batches): "
        + "; ".join(
            f"{n}: {r['batch_s'] * 1000:.0f} ms, {r['caught_up_s'] * 1000:.0f} ms, {r['ledger_bytes'] / 1000:.1f} KB, "
            f"{r['metadata_bytes_after_25'] / 1e6:.1f} MB"
            for n, r in by_partitions.items()
        )
        + " (target ≤ 1 s at 1,000)"
    )
    console.print(
        f"{tables['tables']} tables, {tables['records']:,} records caught up by one `ingest run` (spawn to exit): "
        f"{tables['seconds']:.1f}s, {tables['records_per_s']:,.0f} records/s in {tables['batches']} batches; "
        f"largest process {tables['largest_process_peak_rss_mb']:.0f} MB (one batch's budget "
        f"{tables['batch_budget_mb']:.0f} MB); a run with nothing new {tables['caught_up_s']:.1f}s"
    )
    with RESULTS.open("a") as out:
        out.write(json.dumps(report) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))


@contextlib.contextmanager
def _s3_and_rest(console: Any) -> Iterator[tuple[str, str] | None]:
    """moto's S3 server with a bucket ``lake``, and a REST catalog server warehoused in it: (the S3
    properties as JSON, the REST URI); None, saying why, where they cannot run."""
    from tests.services.iceberg_rest import RestCatalog, RestUnavailable
    from tests.services.moto import S3Server, S3Unavailable

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        try:
            s3 = servers.enter_context(S3Server(Path(tmp) / "moto.log"))
            s3.create_bucket("lake")
            rest = servers.enter_context(RestCatalog(Path(tmp) / "rest", "s3://lake/rest", s3.properties()))
        except (S3Unavailable, RestUnavailable) as error:
            console.print(f"S3 stages skipped: {error}")
            yield None
            return
        yield json.dumps(s3.properties()), rest.uri


def clean_topics(args: argparse.Namespace, formats: set[str], console: Any) -> dict[str, Any]:
    """The orders topic, and its Avro twin where ``args.registry`` is set, produced; for each
    format, the good values of its poison topics by schema id (:func:`poison.run`)."""
    from ingest.kafka.admin import create_topic, produce

    create_topic(args.bootstrap, args.topic, args.partitions)
    started = time.perf_counter()
    produce(args.bootstrap, args.topic, ((i % args.partitions, None, payload(i), None) for i in range(args.records)))
    console.print(f"produced {args.records:,} records in {time.perf_counter() - started:.1f}s")
    good: dict[str, Any] = {"json": lambda _: (payload(i) for i in range(args.records))}
    if "avro" in formats and args.registry is not None:
        schema_id = poison_topic(args, "avro", args.topic + AVRO_TOPIC)
        assert schema_id is not None
        values = avro_payloads(schema_id, args.records)
        produce(
            args.bootstrap,
            args.topic + AVRO_TOPIC,
            ((i % args.partitions, None, v, None) for i, v in enumerate(values)),
        )
        good["avro"] = poison.framed(values)
    return good


def poison_topic(args: argparse.Namespace, fmt: str, topic: str) -> int | None:
    """``topic`` created; for Avro, its value subject registered: the schema id."""
    from ingest.kafka.admin import create_topic

    create_topic(args.bootstrap, topic, args.partitions)
    return _register(args.registry, topic + "-value") if fmt == "avro" else None


@contextlib.contextmanager
def registry_server(console: Any) -> Iterator[str | None]:
    """Apicurio Registry for the Avro stages (its URL), or None where it cannot run (said why)."""
    from tests.services.apicurio import Apicurio, RegistryUnavailable

    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = Apicurio(Path(tmp)).start()
        except RegistryUnavailable as error:
            console.print(f"Apicurio Registry cannot run here: {error}")
            yield None
            return
        try:
            yield server.url
        finally:
            server.stop()


def _register(url: str, subject: str) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": 10}).register_schema(
        subject, Schema(json.dumps(AVRO_SCHEMA), "AVRO")
    )


if __name__ == "__main__":
    main()
