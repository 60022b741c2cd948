"""``make soak``: racing copies, kills, rollbacks, publishes and maintenance against one table for
minutes, then every record checked by content: each good record a row exactly once, each poison
record a dead letter exactly once, and ``ingest verify`` ok for both pipelines.

What runs at once, on Apache Kafka (one broker, started here) and a PostgreSQL catalog:

* a producer writing throughout into two topics, one record in 97 poison (five kinds);
* pipeline ``orders`` (topic of 4 partitions) and pipeline ``refunds`` (2 partitions), both into
  the same table, each with its own dead-letter table;
* pipeline ``customers``, a changelog (Debezium changes over 400 keys, 2 partitions) into a table
  of its own, checked against the fold of its changes (:mod:`tests.soak.changelog`);
* rounds of 1-3 racing copies of ``ingest run --until-caught-up`` (a cap of 150-2,000 records per
  batch each), started every 0.2-2.5 s, 80 % of them SIGKILLed at a random moment;
* ``ingest maintain`` (keep 3 snapshots, no retention) in a quarter of the rounds;
* ``ingest replay --rollback`` or ``--publish`` from one of the last six ledger snapshots of a
  pipeline in 30 % of the rounds;
* now and then a foreign writer setting ``commit.retry.num-retries=4`` on the table (the protocol
  forces the library's retries off in each commit, whatever the table says).

Then the producer stops, each pipeline catches up without faults, and the tables are checked.
Exits 0 if every record is where it belongs exactly once, 1 otherwise (saying which).

Settings (environment): ``SOAK_SECONDS`` (default 300), ``SOAK_SEED`` (random by default; printed),
``INGEST_TEST_POSTGRES_URI`` (the catalog; as the tests), ``SOAK_CATALOG=sqlite`` for a SQLite file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer

from ingest.config import load
from ingest.core.ledger_codec import find_ledger
from ingest.iceberg.catalog import connect
from ingest.iceberg.layout import existing
from ingest.kafka.admin import create_topic
from tests.services import kafka as kafka_service
from tests.soak import changelog

REPO = Path(__file__).resolve().parents[2]
POSTGRES_URI = os.environ.get("INGEST_TEST_POSTGRES_URI", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
POISON = [b"{not json", b'{"amount": 1}', b'{"order_id": "x"}', b"[1]", b""]
SCHEMA: list[dict[str, Any]] = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "amount", "type": "decimal(12,2)"},
    {"name": "created_at", "type": "timestamptz"},
]
#: records the producer sends per topic every 50 ms (100 a second): what a run of the smallest
#: cap keeps up with on two busy cores, so a backlog does not grow without end
RECORDS_PER_TICK = 5
#: batches a racing copy runs at most (it is one of many; the last catch-up drains the rest)
MAX_BATCHES = 25
#: exit codes a racing copy may end with: done, retry later (fenced, contention), SIGKILLed
RUN_OK = {0, 75, -signal.SIGKILL}
#: a replay may also be refused (65: another pipeline's ledger would be lost, a publish main
#: cannot carry over) or find main moving (75)
REPLAY_OK = {0, 65, 75, -signal.SIGKILL}


@dataclass
class Produced:
    """What the producer's delivery reports say landed, per coordinates: (order id, poison?)."""

    records: dict[tuple[str, int, int], tuple[int, bool]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Tally:
    runs: int = 0
    kills: int = 0
    maintains: int = 0
    replays: Counter[str] = field(default_factory=Counter)
    foreign: int = 0
    exits: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def _producer(
    bootstrap: str, topics: dict[str, int], produced: Produced, changes: changelog.Changes, stop: threading.Event
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    seq = 0

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            return
        order_id, poison = message.key().decode().split(":")
        with produced.lock:
            produced.records[(message.topic(), message.partition(), message.offset())] = (int(order_id), poison == "1")

    while not stop.is_set():
        for topic, partitions in topics.items():
            for _ in range(RECORDS_PER_TICK):
                seq += 1
                poison = seq % 97 == 0
                value = (
                    POISON[seq % len(POISON)]
                    if poison
                    else json.dumps(
                        {"order_id": seq, "amount": f"{seq % 1000}.25", "created_at": "2026-12-01T10:00:00Z"}
                    ).encode()
                )
                producer.produce(
                    topic,
                    value=value,
                    key=f"{seq}:{int(poison)}".encode(),
                    partition=seq % partitions,
                    on_delivery=delivered,
                )
            producer.poll(0)
        changes.send(producer, RECORDS_PER_TICK)
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(30)


def _config(
    directory: Path,
    name: str,
    topic: str,
    table: str,
    catalog: dict[str, str],
    cap: int,
    schema: list[dict[str, Any]] = SCHEMA,
    changes: dict[str, Any] | None = None,
) -> Path:
    data = {
        "pipeline": name,
        "kafka": {"bootstrap.servers": os.environ["SOAK_BOOTSTRAP"]},
        "topics": [topic],
        "catalog": catalog,
        "table": table,
        "schema": schema,
        **({"changes": changes} if changes is not None else {}),
        "batch": {"max_records": cap, "read_timeout_s": 30},
        "maintenance": {"keep_last_snapshots": 3, "snapshot_retention_hours": 0},
    }
    path = directory / f"{name}-{cap}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _ingest(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ingest", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _finish(process: subprocess.Popen[str], what: str, allowed: set[int], tally: Tally) -> None:
    _, stderr = process.communicate(timeout=600)
    tally.exits[f"{what} {process.returncode}"] += 1
    if what.startswith("replay") and process.returncode == 78 and "has no snapshot" in stderr:
        return  # maintain expired the snapshot it chose between the choice and the replay
    if process.returncode not in allowed:
        tally.failures.append(f"{what} exited {process.returncode}: {stderr.strip()[-20000:]}")


def _ledger_snapshots(config_path: Path) -> list[int]:
    config = load(config_path)
    table = existing(connect(config.catalog), config.table)
    if table is None:
        return []
    found = []
    for snap in table.ancestry():
        if find_ledger(config.pipeline, [snap]) is not None:
            found.append(snap.snapshot_id)
        if len(found) == 6:
            break
    return found


def _foreign_retries(config_path: Path) -> None:
    config = load(config_path)
    table = existing(connect(config.catalog), config.table)
    if table is not None:
        with table.table.transaction() as transaction:
            transaction.set_properties({"commit.retry.num-retries": "4"})


def _round(
    rng: random.Random, configs: dict[str, list[Path]], tally: Tally, background: list[threading.Thread]
) -> None:
    pipeline = rng.choice(sorted(configs))
    copies = []
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(configs[pipeline])
        run = _ingest("run", "--until-caught-up", "--max-batches", str(MAX_BATCHES), "-c", str(path))
        copies.append((run, rng.random() < 0.8))
        tally.runs += 1
    if rng.random() < 0.25:
        tally.maintains += 1
        maintain = _ingest("maintain", "-c", str(configs[pipeline][0]))
        background.append(threading.Thread(target=_finish, args=(maintain, "maintain", {0, 75}, tally)))
        background[-1].start()
    if rng.random() < 0.30:
        snapshots = _ledger_snapshots(configs[pipeline][0])
        if snapshots:
            how = rng.choice(["--rollback", "--publish"])
            tally.replays[how] += 1
            replay = _ingest(
                "replay", "--from-snapshot", str(rng.choice(snapshots)), how, "-c", str(configs[pipeline][0])
            )
            background.append(threading.Thread(target=_finish, args=(replay, f"replay {how}", REPLAY_OK, tally)))
            background[-1].start()
    if rng.random() < 0.05:
        tally.foreign += 1
        try:
            _foreign_retries(configs[pipeline][0])
        except Exception as error:  # a commit race with the pipeline: the foreign writer gives up, as a tool would
            tally.exits[f"foreign {type(error).__name__}"] += 1
    kill_at = time.monotonic() + rng.uniform(0.3, 5.0)
    for process, doomed in copies:
        if doomed:
            time.sleep(max(0.0, kill_at - time.monotonic()))
            if process.poll() is None:
                process.kill()
                tally.kills += 1
        _finish(process, "run", RUN_OK, tally)
    time.sleep(rng.uniform(0.2, 2.5))


def _catch_up(path: Path, tally: Tally) -> None:
    for _ in range(5):
        process = _ingest("run", "--until-caught-up", "-c", str(path))
        _, stderr = process.communicate(timeout=900)
        if process.returncode == 0:
            return
        tally.exits[f"catch-up {process.returncode}"] += 1
    tally.failures.append(f"{path.name}: the fault-free catch-up did not finish: {stderr.strip()[-2000:]}")


def _check(config_path: Path, produced: Produced, topic: str, tally: Tally) -> dict[str, int]:
    config = load(config_path)
    catalog = connect(config.catalog)
    rows_table = existing(catalog, config.table)
    dead_table = existing(catalog, config.dead_letters)
    assert rows_table is not None and dead_table is not None
    rows = rows_table.scan_columns(["_kafka_topic", "_kafka_partition", "_kafka_offset", "order_id"]).to_pylist()
    dead = dead_table.scan_columns(["topic", "partition", "offset"]).to_pylist()
    mine = {k: v for k, v in produced.records.items() if k[0] == topic}
    seen_rows = Counter(
        (r["_kafka_topic"], r["_kafka_partition"], r["_kafka_offset"]) for r in rows if r["_kafka_topic"] == topic
    )
    seen_dead = Counter((d["topic"], d["partition"], d["offset"]) for d in dead if d["topic"] == topic)
    problems = []
    for coordinates, (_order_id, poison) in sorted(mine.items()):
        in_rows, in_dead = seen_rows.get(coordinates, 0), seen_dead.get(coordinates, 0)
        if (poison and (in_rows, in_dead) != (0, 1)) or (not poison and (in_rows, in_dead) != (1, 0)):
            problems.append(f"{coordinates} ({'poison' if poison else 'good'}): {in_rows} rows, {in_dead} dead letters")
    strangers = (set(seen_rows) | set(seen_dead)) - set(mine)
    problems += [f"{c}: stored but never produced" for c in sorted(strangers)]
    wrong = [
        f"{(r['_kafka_topic'], r['_kafka_partition'], r['_kafka_offset'])}: order_id {r['order_id']}"
        for r in rows
        if r["_kafka_topic"] == topic
        and (key := (r["_kafka_topic"], r["_kafka_partition"], r["_kafka_offset"])) in mine
        and mine[key][0] != r["order_id"]
    ]
    problems += [f"{w} is not the record produced there" for w in wrong]
    poisoned = sum(1 for _, p in mine.values() if p)
    return _report(config_path, problems, {"records": len(mine), "poison": poisoned}, tally)


def _check_changes(config_path: Path, changes: changelog.Changes, tally: Tally) -> dict[str, int]:
    problems, figures = changelog.problems(config_path, changes)
    return _report(config_path, problems, figures, tally)


def _report(config_path: Path, problems: list[str], figures: dict[str, int], tally: Tally) -> dict[str, int]:
    """``problems`` and what ``ingest verify`` says as the pipeline's failures; the figures checked."""
    verify = subprocess.run(
        [sys.executable, "-m", "ingest", "verify", "--json", "-c", str(config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    if verify.returncode != 0:
        problems.append(f"ingest verify exited {verify.returncode}: {verify.stdout[-3000:]}")
    pipeline = load(config_path).pipeline
    for problem in problems[:40]:
        tally.failures.append(f"{pipeline}: {problem}")
    if len(problems) > 40:
        tally.failures.append(f"{pipeline}: … {len(problems) - 40} more")
    return figures | {"problems": len(problems)}


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "300"))
    seed = int(os.environ.get("SOAK_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    print(f"soak: {seconds:.0f} s, seed {seed} (SOAK_SEED={seed} repeats the choices)", flush=True)
    tmp = tempfile.mkdtemp(prefix="soak-")
    with kafka_service.KafkaCluster(Path(tmp) / "kafka") as kafka:
        directory = Path(tmp)
        os.environ["SOAK_BOOTSTRAP"] = kafka.bootstrap_servers
        name = f"soak{uuid.uuid4().hex[:8]}"
        uri = f"sqlite:///{directory}/catalog.db" if os.environ.get("SOAK_CATALOG") == "sqlite" else POSTGRES_URI
        (directory / "warehouse").mkdir()
        catalog = {"name": "soak", "type": "sql", "uri": uri, "warehouse": (directory / "warehouse").as_uri()}
        topics = {f"{name}_orders": 4, f"{name}_refunds": 2}
        changes = changelog.Changes(f"{name}_{changelog.PIPELINE}", seed)
        for topic, partitions in {**topics, changes.topic: changelog.PARTITIONS}.items():
            create_topic(kafka.bootstrap_servers, topic, partitions)
        table = f"{name}.orders"
        configs = {
            pipeline: [
                _config(directory, pipeline, f"{name}_{pipeline}", table, catalog, cap) for cap in (150, 700, 2000)
            ]
            for pipeline in ("orders", "refunds")
        }
        configs[changelog.PIPELINE] = [
            _config(
                directory,
                changelog.PIPELINE,
                changes.topic,
                f"{name}.{changelog.PIPELINE}",
                catalog,
                cap,
                changelog.SCHEMA,
                changelog.CHANGES,
            )
            for cap in (150, 700, 2000)
        ]
        produced, stop = Produced(), threading.Event()
        producing = threading.Thread(target=_producer, args=(kafka.bootstrap_servers, topics, produced, changes, stop))
        producing.start()
        tally = Tally()
        background: list[threading.Thread] = []
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds and not tally.failures:
                _round(rng, configs, tally, background)
        finally:
            stop.set()
            producing.join()
            for thread in background:
                thread.join()
        print(
            f"soak: {tally.runs} runs, {tally.kills} kills, {tally.maintains} maintains, "
            f"{sum(tally.replays.values())} replays ({dict(tally.replays)}), {tally.foreign} foreign property changes "
            f"in {time.monotonic() - started:.0f} s; exits {dict(sorted(tally.exits.items()))}",
            flush=True,
        )
        for paths in configs.values():
            _catch_up(paths[-1], tally)
        for pipeline, paths in configs.items():
            if pipeline == changelog.PIPELINE:
                checked = _check_changes(paths[-1], changes, tally)
            else:
                checked = _check(paths[-1], produced, f"{name}_{pipeline}", tally)
            print(f"soak: {pipeline}: {checked}", flush=True)
    for failure in tally.failures:
        print(f"FAILED {failure}", flush=True)
    if tally.failures:
        print(f"soak: the warehouse and configs are kept in {tmp} (the catalog: {uri})", flush=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"soak: {'FAILED' if tally.failures else 'ok'} (seed {seed})", flush=True)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
