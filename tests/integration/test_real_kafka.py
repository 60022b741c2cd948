"""What only a real Apache Kafka can show: transactions, retention, timestamp lookups.

The embedded tansu delivers aborted records to read_committed consumers, panics on
``delete_records`` and answers timestamp lookups with 0 (ENVIRONMENT.md), so these run only on
Apache Kafka (the suite's default broker) or an external cluster.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import uuid
from datetime import UTC, datetime

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from ingest.errors import ExitCode
from ingest.kafka.admin import create_topic, produce
from tests.integration.conftest import Env, MakeEnv, broker_choice, record

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(broker_choice()[0] == "tansu", reason="needs Apache Kafka: " + broker_choice()[1]),
]


def _transactional(env: Env) -> Producer:
    producer = Producer({"bootstrap.servers": env.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    return producer


def _send(producer: Producer, env: Env, first: int, count: int) -> None:
    for i in range(first, first + count):
        partition, key, value, headers = record(i, env.partitions, None)
        producer.produce(env.topic, value, key, partition=partition, headers=list(headers))


def _order_ids(env: Env) -> set[int]:
    from ingest.assembly import open_pipeline

    ids = open_pipeline(env.config).rows.scan_columns(["order_id"])["order_id"].to_pylist()
    assert len(ids) == len(set(ids))
    return set(ids)


def test_aborted_transactions_never_land_and_an_open_one_holds_the_batch_at_the_stable_offset(
    make_env: MakeEnv,
) -> None:
    env = make_env(partitions=2, batch={"max_records": 70})
    producer = _transactional(env)
    for k in range(6):  # committed and aborted transactions interleaved, 40 records each
        producer.begin_transaction()
        _send(producer, env, k * 40, 40)
        producer.flush(30)  # on the broker before the abort (an abort purges what is still queued)
        if k % 2 == 0:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    caught_up = env.cli("run", "--until-caught-up", "--json")

    assert caught_up.returncode == 0, caught_up.stderr
    assert env.counts() == (120, 0)  # three committed transactions; markers and aborted records left gaps
    assert _order_ids(env) == {i for k in (0, 2, 4) for i in range(k * 40, k * 40 + 40)}
    env.verify()

    producer.begin_transaction()  # left open across the next batch
    _send(producer, env, 1_000, 30)
    producer.flush(30)
    plain = Producer({"bootstrap.servers": env.bootstrap})
    plain.produce(env.topic, json.dumps({"order_id": 5_000}).encode(), b"k", partition=0)
    plain.flush(30)

    held = env.cli("run", "--until-caught-up", "--json")

    assert held.returncode == 0, held.stderr
    assert env.counts() == (120, 0)  # nothing past the last stable offset: the open transaction holds it
    env.verify()
    producer.commit_transaction(30)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (151, 0)  # the transaction and the record behind it, once
    env.verify()


def test_a_partition_held_by_an_open_transaction_is_complete_only_through_its_last_read_to_the_end(
    make_env: MakeEnv,
) -> None:
    import time

    env = make_env(partitions=2)
    env.produce(20)
    assert env.cli("run", "--until-caught-up").returncode == 0
    first = json.loads(env.cli("status", "--json").stdout)["valid_through_ms"]
    transactional = _transactional(env)
    transactional.begin_transaction()  # left open on partition 1 across the next run
    for i in range(100, 105):
        _, key, value, _ = record(i, 1, None)
        transactional.produce(env.topic, value, key, partition=1)
    transactional.flush(30)
    plain = Producer({"bootstrap.servers": env.bootstrap})
    for i in range(200, 210):
        _, key, value, _ = record(i, 1, None)
        plain.produce(env.topic, value, key, partition=0)
    plain.flush(30)
    before = int(time.time() * 1000)

    assert env.cli("run", "--until-caught-up").returncode == 0

    status = json.loads(env.cli("status", "--json").stdout)
    assert status["batch"] == 2 and [p["committed"] for p in status["partitions"]] == [20, 10]
    # partition 1 was read to its readable end, but records written before the run wait behind the
    # open transaction: it is complete only through the first run's read of its end
    assert status["valid_through_ms"] == first < before
    transactional.commit_transaction(30)
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert json.loads(env.cli("status", "--json").stdout)["valid_through_ms"] >= before
    env.verify()


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_retention_deleting_unread_records(make_env: MakeEnv, policy: str) -> None:
    env = make_env(partitions=2, on_data_loss=policy)
    env.produce(100)
    assert env.cli("run").returncode == 0
    env.produce(100)  # offsets 50..99 of each partition: not read yet
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    deleted = admin.delete_records([KafkaTP(env.topic, 0, 80)])  # retention removes [0, 80) of partition 0
    for future in deleted.values():
        future.result(30)

    result = env.cli("run", "--until-caught-up", "--json")

    if policy == "fail":
        assert result.returncode == 65, result.stderr
        assert f"data loss on {env.topic}[0]" in result.stderr and "[50, 80)" in result.stderr
        assert env.counts() == (100, 0)  # nothing written
        return
    assert result.returncode == 0, result.stderr
    assert env.counts() == (100 + 100 - 30, 0)
    history = json.loads(env.cli("history", "--json").stdout)
    assert any(r["lost"] == [{"topic": env.topic, "partition": 0, "start": 50, "end": 80}] for r in history), history
    env.verify()


def _one_a_minute(env: Env, count: int, partitions: int = 1) -> None:
    """Records ``0..count``, one a minute in record time; record 30 of each partition is the first at
    or after 2026-12-01T00:00:00Z."""
    producer = Producer({"bootstrap.servers": env.bootstrap})
    cut = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
    for i in range(count):
        partition, key, value, _ = record(i, partitions, None)
        minute = i // partitions
        producer.produce(env.topic, value, key, partition=partition, timestamp=cut + (minute - 30) * 60_000)
    producer.flush(30)
    env.produced = count


def test_reset_to_a_timestamp_uses_kafkas_time_index(make_env: MakeEnv) -> None:
    env = make_env(partitions=1)
    _one_a_minute(env, 100)
    assert env.cli("run", "--until-caught-up").returncode == 0

    reset = env.cli("reset", "--to-timestamp", "2026-12-01T00:00:00Z", "--reason", "re-read by time", "--json")

    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout)["offsets"][0]["to"] == 30
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (100 + 70, 0)  # offsets 30..99 once more: a backward reset re-reads on purpose
    env.verify()


def test_a_pipeline_starting_at_a_timestamp_uses_kafkas_time_index(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, start="2026-12-01T00:00:00Z", batch={"max_records": 50})
    _one_a_minute(env, 200, partitions=2)  # per partition: 100 records, offsets 30..99 at or after the start

    caught_up = env.cli("run", "--until-caught-up", "--json")

    assert caught_up.returncode == 0, caught_up.stderr
    first = json.loads(caught_up.stdout.splitlines()[0])
    assert sorted((r["partition"], r["start"]) for r in first["ranges"]) == [(0, 30), (1, 30)]
    assert env.counts() == (140, 0)
    assert _order_ids(env) == {i for i in range(200) if i // 2 >= 30}
    env.verify()
    env.produce(10)  # the start applies to the first batch only: what follows is read from the ledger
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (150, 0)
    env.verify()


def test_partitions_added_while_the_pipeline_runs_start_at_earliest(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(100)
    assert env.cli("run", "--until-caught-up").returncode == 0
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    for future in admin.create_partitions([NewPartitions(env.topic, 4)]).values():
        future.result(30)
    env.partitions = 4
    env.produce(200)  # 50 to each partition, the two new ones included

    assert env.cli("run", "--until-caught-up").returncode == 0

    assert env.counts() == (300, 0)
    status = json.loads(env.cli("status", "--json").stdout)
    assert [(p["partition"], p["committed"]) for p in status["partitions"]] == [(0, 100), (1, 100), (2, 50), (3, 50)]
    env.verify()


def test_a_topic_deleted_and_recreated_with_the_same_name_stops_the_pipeline(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    env.produce(100)
    assert env.cli("run", "--until-caught-up").returncode == 0
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    for future in admin.delete_topics([env.topic], operation_timeout=30).values():
        future.result(30)
    recreated = _wait_recreated(env)
    assert recreated, "the topic could not be created again"
    env.produced = 0
    env.produce(20)  # a new topic: offsets restart at 0, below the ledger's 50

    result = env.cli("run", "--until-caught-up")

    assert result.returncode == 65, result.stderr
    assert "deleted and recreated" in result.stderr
    assert env.counts() == (100, 0)  # nothing of the new topic was taken for the old one's offsets


def _topic_id(env: Env, topic: str) -> str:
    """The topic's id as Kafka prints it (librdkafka's str() uses the other base64 alphabet)."""
    from confluent_kafka import TopicCollection

    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    (future,) = admin.describe_topics(TopicCollection([topic]), request_timeout=10).values()
    return str(future.result().topic_id).replace("+", "-").replace("/", "_")


def _wait_gone(env: Env, topic: str, timeout_s: float = 60.0) -> None:
    import time

    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(30)
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} is still listed after its deletion"
        time.sleep(0.2)


def _numbered(env: Env, topic: str, first: int, count: int) -> None:
    """Records ``first..first+count`` (order ids too) to ``topic``."""
    produce(env.bootstrap, topic, [record(i, env.partitions, None) for i in range(first, first + count)])


@pytest.mark.parametrize("subscription", ["topics", "topics_pattern"])
def test_a_recreated_topic_holding_more_records_is_refused_until_reset_then_read_whole(
    make_env: MakeEnv, subscription: str
) -> None:
    env = make_env(partitions=2)
    other = f"{env.topic}-b"  # with the pattern: a second topic that keeps the pipeline committing
    if subscription == "topics_pattern":
        create_topic(env.bootstrap, other, 2)
        data = yaml.safe_load(env.config_path.read_text())
        del data["topics"]
        data["topics_pattern"] = f"{env.topic}(-b)?"
        env.config_path.write_text(yaml.safe_dump(data))
        _numbered(env, other, 10_000, 20)
    _numbered(env, env.topic, 0, 300)
    assert env.cli("run", "--until-caught-up").returncode == 0
    old_id = _topic_id(env, env.topic)
    _wait_gone(env, env.topic)
    if subscription == "topics_pattern":  # a batch while the topic is gone: its offsets and id are kept
        _numbered(env, other, 10_020, 10)
        assert env.cli("run", "--until-caught-up").returncode == 0
    assert _wait_recreated(env), "the topic could not be created again"
    new_id = _topic_id(env, env.topic)
    assert new_id != old_id
    # more records than the ledger read of the old topic: its offsets alone would look fine
    _numbered(env, env.topic, 300, 450)
    before = env.counts()

    refused = env.cli("run", "--until-caught-up")

    assert refused.returncode == 65, refused.stderr
    message = refused.stderr
    assert f"topic '{env.topic}' was deleted and recreated under the same name" in message
    assert f"'{env.topic}': the ledger has {old_id}, Kafka has {new_id}" in message
    assert env.counts() == before  # nothing committed
    assert env.cli("verify").returncode == 65  # the old topic's rows cannot stand in for the new one's

    # the command the message names, as an operator runs it
    command = message[message.index("ingest reset -c <config> ") : message.index(" (or name the offsets")]
    assert f"--to-offsets {env.topic}:0=0,{env.topic}:1=0 " in command
    reset = env.cli(*shlex.split(command.removeprefix("ingest ").replace("-c <config> ", "")))
    assert reset.returncode == 0, reset.stderr
    assert env.cli("run", "--until-caught-up").returncode == 0

    assert env.counts() == (before[0] + 450, 0)  # exactly the new topic's records, each once
    from ingest.assembly import open_pipeline

    rows = open_pipeline(env.config).rows.scan_columns(["order_id", "_kafka_topic"]).to_pylist()
    ids = [row["order_id"] for row in rows if row["_kafka_topic"] == env.topic]
    assert sorted(ids) == list(range(750))  # the old topic's 300 and the new one's 450
    env.verify()


def _wait_recreated(env: Env, timeout_s: float = 60.0) -> bool:
    """Create the topic again once the broker has finished deleting it."""
    import time

    from ingest.errors import BrokerUnavailable
    from ingest.kafka.admin import create_topic

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            create_topic(env.bootstrap, env.topic, 2)
        except BrokerUnavailable:  # still being deleted
            time.sleep(0.2)
            continue
        metadata = AdminClient({"bootstrap.servers": env.bootstrap}).list_topics(env.topic, timeout=10)
        topic = metadata.topics.get(env.topic)
        if topic is not None and topic.error is None and len(topic.partitions) == 2:
            return True
        time.sleep(0.2)
    return False


def _live_records(env: Env, partition: int = 0) -> dict[int, bytes]:
    """Offset → key of every record a read_committed consumer gets from the partition now."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "probe", "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(KafkaTP(env.topic, partition), timeout=10)
        consumer.assign([KafkaTP(env.topic, partition, low)])
        found: dict[int, bytes] = {}
        while high > low and max(found, default=low - 1) < high - 1:
            for message in consumer.consume(500, timeout=1):
                assert message.error() is None, message.error()
                offset, key = message.offset(), message.key()
                assert offset is not None and key is not None
                found[offset] = key
        return found
    finally:
        consumer.close()


def test_a_compacted_topic_is_read_whole_across_the_offsets_cleaning_removed(make_env: MakeEnv) -> None:
    import time

    env = make_env(partitions=1, batch={"max_records": 25})
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    compact = ConfigResource(
        ResourceType.TOPIC,
        env.topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in {
                "cleanup.policy": "compact",
                "segment.ms": "100",  # a segment rolls on the first append after 100 ms; only rolled ones are cleaned
                "min.cleanable.dirty.ratio": "0.01",
                "min.compaction.lag.ms": "0",
            }.items()
        ],
    )
    for future in admin.incremental_alter_configs([compact]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": env.bootstrap})
    for round_ in range(20):  # over twenty segments: a key of its own for every third record, the
        for i in range(round_ * 10, round_ * 10 + 10):  # others share ten keys, so cleaning leaves gaps
            _, _, value, _ = record(i, 1, None)
            key = f"once{i}" if i % 3 == 0 else f"key{i % 10}"
            producer.produce(env.topic, value, key.encode(), partition=0)
        producer.flush(30)
        time.sleep(0.15)
    env.produced = 200

    deadline = time.monotonic() + 60
    settled: dict[int, bytes] = {}
    while time.monotonic() < deadline:  # until the cleaner has run and then left the log alone
        live = _live_records(env)
        if len(live) < 200 and live == settled:
            break
        settled = live
        time.sleep(1.5)
    else:
        pytest.fail(f"the log cleaner did not settle within 60s ({len(settled)} of 200 records left)")
    assert max(settled) == 199  # the active segment is never cleaned: the log still ends at 200

    result = env.cli("run", "--until-caught-up", "--json")

    assert result.returncode == 0, result.stderr
    assert _live_records(env) == settled  # nothing was cleaned while the pipeline read
    assert _order_ids(env) == set(settled)  # order_id i was produced at offset i: every survivor once
    batches = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(batches) == 8 and sum(b["records"] for b in batches) == len(settled), batches
    status = json.loads(env.cli("status", "--json").stdout)
    assert [p["committed"] for p in status["partitions"]] == [200]  # complete by position, gaps and all
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_values_of_tens_of_megabytes_land_whole_and_one_over_max_value_bytes_is_a_dead_letter_saying_so(
    make_env: MakeEnv,
) -> None:
    # Kafka's defaults stop at 1 MB; a topic raised to 30 MB delivers 5 and 20 MB values, which
    # must land whole (they were dead letters, "straddling object straddles two block boundaries")
    env = make_env(partitions=1, schema=[{"name": "order_id", "type": "long", "required": True},
                                         {"name": "blob", "type": "string"}],
                   dead_letters={"max_value_bytes": 24 << 20}, partition_by=[])  # fmt: skip
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, env.topic)
    resource.add_incremental_config(
        ConfigEntry("max.message.bytes", str(30 << 20), incremental_operation=AlterConfigOpType.SET)
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": env.bootstrap, "message.max.bytes": 30 << 20, "compression.type": "none"})
    sizes = {1: 5 << 20, 3: 20 << 20, 4: 25 << 20}  # order_id -> MB of incompressible text
    for i in range(6):
        blob = os.urandom(sizes.get(i, 30) * 3 // 4).hex()[: sizes.get(i, 30)] if i in sizes else f"small-{i}"
        producer.produce(env.topic, json.dumps({"order_id": i, "blob": blob}).encode(), partition=0)
        producer.flush(60)

    result = env.cli("run", "--until-caught-up", "--json")

    assert result.returncode == 0, result.stderr
    from ingest.assembly import open_pipeline

    pipeline = open_pipeline(env.config)
    rows = pipeline.rows.table.scan(selected_fields=("order_id", "blob")).to_arrow().sort_by("order_id")
    assert rows.column("order_id").to_pylist() == [0, 1, 2, 3, 5]
    assert [len(b) for b in rows.column("blob").to_pylist()] == [7, 5 << 20, 7, 20 << 20, 7]
    [dead] = pipeline.dead.table.scan(selected_fields=("offset", "error")).to_arrow().to_pylist()
    assert dead["offset"] == 4
    assert (
        dead["error"].startswith("value is 26,214,4")
        and "over dead_letters.max_value_bytes (25,165,824)" in dead["error"]
    )
    env.produced = 6
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_record_batch_over_the_consumers_receive_limit_is_a_config_error_naming_where_and_check_says_so_first(
    make_env: MakeEnv,
) -> None:
    # the topic accepts 8 MB batches, the pipeline's consumer takes 2 MB responses: a 3 MB record
    # made every run exit 75 (BrokerUnavailable, forever retried), librdkafka's reason only under -v
    env = make_env(partitions=2, partition_by=[])
    data = yaml.safe_load(env.config_path.read_text())
    data["kafka"] |= {"receive.message.max.bytes": 2_000_000, "fetch.max.bytes": 1_000_000}
    env.config_path.write_text(yaml.safe_dump(data))
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, env.topic)
    resource.add_incremental_config(
        ConfigEntry("max.message.bytes", str(8 << 20), incremental_operation=AlterConfigOpType.SET)
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": env.bootstrap, "message.max.bytes": 8 << 20, "compression.type": "none"})
    for i in range(20):
        producer.produce(env.topic, record(i, 2, None)[2], partition=i % 2)
    value = record(20, 2, None)[2]
    assert value is not None
    big = json.loads(value) | {"blob": os.urandom(1_500_000).hex()}  # 3 MB, incompressible
    producer.produce(env.topic, json.dumps(big).encode(), partition=1)  # offset 10 of partition 1
    producer.flush(60)
    for i in range(21, 31):
        producer.produce(env.topic, record(i, 2, None)[2], partition=i % 2)
    producer.flush(60)

    checked = env.cli("check")
    ran = env.cli("run")

    assert checked.returncode == ExitCode.CONFIG, checked.stdout + checked.stderr
    said = " ".join(checked.stdout.split())
    assert (
        "failed kafka: kafka.receive.message.max.bytes: the consumer takes responses of up to 2,000,000 bytes, but "
        f"topic '{env.topic}' (max.message.bytes 8,388,608) accepts record batches that come in larger ones" in said
    )
    assert "Raise receive.message.max.bytes in `kafka:` to at least 8,389,120" in said
    assert ran.returncode == ExitCode.CONFIG, ran.stderr
    said = " ".join(ran.stderr.split())
    found = re.search(
        rf"RecordTooLarge\): kafka.receive.message.max.bytes: the record batch at offset 10 of {env.topic}\[1\] comes "
        r"in a response of ([\d,]+) bytes, over the consumer's receive.message.max.bytes \(2,000,000\)",
        said,
    )
    assert found is not None and int(found.group(1).replace(",", "")) > 3_000_000, said
    assert "Nothing was committed; the records stay in Kafka" in said and "Traceback" not in said
    from ingest.assembly import open_pipeline

    assert open_pipeline(env.config).ledger() is None

    data["kafka"] = {"bootstrap.servers": env.bootstrap}  # the fix the message names: librdkafka's default limit
    env.config_path.write_text(yaml.safe_dump(data))
    assert env.cli("check").returncode == 0
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.produced = 31
    assert env.counts() == (31, 0)
    env.verify()
