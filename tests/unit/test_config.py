"""Config validation (ingest.config): every error is a ConfigError that names the key."""

from __future__ import annotations

import copy
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import FieldSpec, PipelineConfig, interpolate, load, parse
from ingest.errors import ConfigError, ExitCode

MINIMAL = textwrap.dedent(
    """\
    pipeline: orders
    kafka:
      bootstrap.servers: "broker:9092"
    topics: [orders]
    catalog:
      name: lake
    table: analytics.orders
    schema:
      - {name: order_id, type: long, required: true}
      - {name: amount, type: "decimal(12, 2)"}
      - {name: created_at, type: timestamptz}
    """
)


def minimal() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(MINIMAL))


def write(tmp_path: Path, text: str, name: str = "pipeline.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def schema_of(config: PipelineConfig) -> list[FieldSpec]:
    """The config's ``schema:`` (None only where a schema registry supplies the schema)."""
    assert config.schema_ is not None
    return config.schema_


def error_of(data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(data, "p.yaml")
    assert caught.value.exit_code is ExitCode.CONFIG
    return str(caught.value)


# --- a valid config ----------------------------------------------------------------------------


def test_minimal_config_loads_with_defaults(tmp_path: Path) -> None:
    config = load(write(tmp_path, MINIMAL), env={})

    assert isinstance(config, PipelineConfig)
    assert config.pipeline == "orders"
    assert config.topics == ["orders"]
    assert config.start == "earliest"
    assert config.on_data_loss == "fail"
    assert config.batch.max_records == 500_000
    assert config.commit.max_attempts == 8
    assert [(f.name, f.type, f.required) for f in schema_of(config)] == [
        ("order_id", "long", True),
        ("amount", "decimal(12,2)", False),  # normalised
        ("created_at", "timestamptz", False),
    ]
    assert config.dead_letters == "analytics.orders_dead_letter"
    assert config.group_id == "ingest-orders"


def test_the_shipped_example_config_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "conf" / "orders.yaml"

    config = load(path, env={})

    assert config.pipeline == "orders"
    assert config.kafka["bootstrap.servers"] == "127.0.0.1:9092"


def test_the_shipped_example_of_several_tables_is_valid() -> None:
    from ingest.config import load_routes

    orders, refunds = load_routes(Path(__file__).resolve().parents[2] / "conf" / "shop_tables.yaml", env={})

    assert (orders.table, orders.topics, orders.unknown_fields) == (
        "analytics.orders",
        ["orders_eu", "orders_us"],
        "capture",
    )
    assert refunds.selects("refunds_eu") and refunds.dead_letters == "analytics.refund_rejects"


def test_the_rest_and_s3_example_takes_its_secrets_from_the_environment() -> None:
    path = Path(__file__).resolve().parents[2] / "conf" / "orders_rest_s3.yaml"
    with pytest.raises(ConfigError, match=r"catalog\.s3\.access-key-id: .*AWS_ACCESS_KEY_ID referenced but not set"):
        load(path, env={})

    config = load(path, env={"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})

    assert config.catalog["type"] == "rest" and config.catalog["s3.secret-access-key"] == "s3cr3t"
    assert config.commit.request_timeout_s == 60


# --- errors name the key -----------------------------------------------------------------------


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split("/")
    for part in parents:
        data = data[int(part)] if isinstance(data, list) else data.setdefault(part, {})
    data[last] = value


def test_a_typo_in_a_top_level_key_is_named() -> None:
    data = minimal()
    data["topic"] = data.pop("topics")

    message = error_of(data)

    assert "topic: unknown key; did you mean `topics`?" in message
    assert "topics: required key is missing" in message
    assert message.startswith("p.yaml is invalid")


def test_a_typo_in_a_nested_key_is_named() -> None:
    data = minimal()
    data["batch"] = {"max_record": 10}

    assert "batch.max_record: unknown key; did you mean `max_records`?" in error_of(data)


def test_a_key_like_none_of_those_there_gets_no_suggestion() -> None:
    data = minimal()
    data["topics"] = [{"name": "orders", "color": "blue"}]

    message = error_of(data)

    assert "topics[0] 'orders'.color: unknown key (`ingest config-schema` lists every key)" in message


@pytest.mark.parametrize("key", ["pipeline", "kafka", "topics", "catalog", "table", "schema"])
def test_a_missing_required_key_is_named(key: str) -> None:
    data = minimal()
    del data[key]

    assert f"  {key}: required key is missing" in error_of(data)


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("schema/1/type", "integer", "schema[1] 'amount'.type: unknown Iceberg type 'integer'"),
        ("schema/1/type", "decimal(12)", "schema[1] 'amount'.type: unknown Iceberg type"),
        ("pipeline", "orders on host-7", "pipeline: must be a stable id"),
        ("pipeline", "orders.v2", "pipeline: must be a stable id"),
        ("table", "orders", "table: must be 'namespace.table'"),
        ("dead_letter_table", "bad table", "dead_letter_table: must be 'namespace.table'"),
        ("partition_by", ["day(created)"], "partition_by: 'day(created)' refers to 'created', which is not in schema"),
        ("partition_by", ["week(created_at)"], "partition_by: 'week(created_at)' is not a partition transform"),
        ("kafka", {"group.id": "g"}, "kafka: needs 'bootstrap.servers'"),
        ("kafka/enable.auto.commit", True, "kafka: 'enable.auto.commit' is set by the pipeline"),
        ("kafka/auto.offset.reset", "latest", "kafka: 'auto.offset.reset' is set by the pipeline"),
        ("kafka/isolation.level", "read_uncommitted", "kafka: 'isolation.level' is set by the pipeline"),
        ("catalog", {"type": "sql"}, "catalog: needs 'name'"),
        ("batch/max_records", 0, "batch.max_records: Input should be greater than 0"),
        ("batch/chunk_records", -5, "batch.chunk_records: Input should be greater than 0"),
        ("batch/workers", 0, "batch.workers: expected a number of processes from 1 to 256, or 'auto'"),
        ("batch/workers", "all", "batch.workers: expected a number of processes from 1 to 256, or 'auto'"),
        ("commit/max_attempts", 0, "commit.max_attempts: Input should be greater than 0"),
        ("start", "beginning", "start: 'beginning' is not a start position: use 'earliest', 'latest', or an ISO-8601"),
        ("start", "2026-12-01T00:00:00", "start: '2026-12-01T00:00:00' is not a start position"),  # no zone
        ("on_data_loss", "ignore", "on_data_loss: Input should be 'fail' or 'skip'"),
        ("topics", [], "topics: needs at least one topic"),
        ("dead_letter_table", "analytics.orders", "dead_letter_table must differ from table"),
        ("renames", {"address.zip": "postcode"}, "renames: 'address.zip' is not a top-level column name"),
        ("renames", {"qty": "quantity", "quantity": "units"}, "'qty' → 'quantity' → 'units' is a chain"),
        ("renames", {"a": "c", "b": "c"}, "renames: two columns are renamed to the same name"),
        ("renames", {"amount": "total"}, "schema: declares 'amount', which renames: renames to 'total'"),
        ("renames", {"_kafka_key": "k"}, "renames: '_kafka_key' is a column the pipeline adds itself"),
        (
            "topics",
            [{"name": "o", "key_subject": "o-key"}],
            "key_subject is for keys in a registry format (key_format: avro, protobuf or json_schema)",
        ),
        ("topics", [{"name": "o", "format": "xml"}], "Input should be 'json', 'avro', 'protobuf' or 'json_schema'"),
        (
            "topics",
            [{"name": "o", "key_format": "json"}],
            "Input should be 'string', 'avro', 'protobuf' or 'json_schema'",
        ),
        ("topics", [{"name": "o", "key_format": "avro"}], "key_format 'avro' needs `schema_registry:`"),
        (
            "topics",
            [{"name": "o", "key_format": "string"}, {"name": "p"}],
            "every topic of a pipeline has the same key_format",
        ),
    ],
)
def test_invalid_values_are_reported_with_their_key(dotted: str, value: Any, expected: str) -> None:
    data = minimal()
    set_path(data, dotted, value)

    assert expected in error_of(data)


@pytest.mark.parametrize("column", ["_kafka_offset", "_kafka_topic", "_kafka_key", "_kafka_key_decoded", "_extra"])
def test_a_reserved_column_name_in_schema_is_rejected(column: str) -> None:
    data = minimal()
    data["schema"].append({"name": column, "type": "long"})

    assert f"schema[3] '{column}'.name: '{column}' is a column the pipeline adds itself" in error_of(data)


def test_duplicate_field_names_are_rejected() -> None:
    data = minimal()
    data["schema"].append({"name": "order_id", "type": "string"})

    assert "schema: duplicate field names ['order_id']" in error_of(data)


def test_every_error_is_reported_at_once() -> None:
    data = minimal()
    data["pipeline"] = "a b"
    data["table"] = "x"
    data["batch"] = {"max_records": 0}

    message = error_of(data)

    assert "pipeline:" in message and "table:" in message and "batch.max_records:" in message


@pytest.mark.parametrize(
    "partition_by", [["order_id"], ["identity(order_id)"], ["day(created_at)", "bucket(16, order_id)"]]
)
def test_valid_transforms_are_accepted(partition_by: list[str]) -> None:
    data = minimal()
    data["partition_by"] = partition_by

    assert parse(data).partition_by == partition_by


@pytest.mark.parametrize(
    "transform", ["bucket(order_id)", "truncate(order_id)", "bucket(0, order_id)", "day(16, created_at)"]
)
def test_transform_arity_is_validated(transform: str) -> None:
    # was: the width was optional for every transform (bucket(col) failed only later, day(16, col)
    # silently ignored the 16)
    data = minimal()
    data["partition_by"] = [transform]

    assert "partition_by:" in error_of(data)


@pytest.mark.parametrize("type_name", ["decimal(40,2)", "decimal(0,0)", "decimal(5,9)"])
def test_decimal_precision_and_scale_are_validated(type_name: str) -> None:
    # was: accepted, then Decoder() raised a bare ValueError for precision > 38
    data = minimal()
    data["schema"][1]["type"] = type_name

    assert "schema[1] 'amount'.type:" in error_of(data)


@pytest.mark.parametrize("type_name", ["decimal(1,0)", "decimal(38,38)", "decimal(38, 0)"])
def test_decimal_bounds_are_accepted(type_name: str) -> None:
    data = minimal()
    data["schema"][1]["type"] = type_name

    assert schema_of(parse(data))[1].type == type_name.replace(" ", "")


# --- files and YAML ----------------------------------------------------------------------------


def test_a_top_level_list_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load(write(tmp_path, "- pipeline: orders\n"), env={})


def test_an_empty_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load(write(tmp_path, ""), env={})


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(write(tmp_path, "pipeline: [orders\n"), env={})


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "nope.yaml", env={})


def test_load_reports_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("topics:", "topic:"))

    with pytest.raises(ConfigError, match=r"(?s)pipeline\.yaml is invalid:\n.*  topic: unknown key"):
        load(path, env={})


# --- ${ENV} interpolation ----------------------------------------------------------------------


def test_env_variables_are_interpolated(tmp_path: Path) -> None:
    text = MINIMAL.replace('"broker:9092"', '"${BROKERS}"').replace("name: lake", "name: ${CATALOG:-lake}")

    config = load(write(tmp_path, text), env={"BROKERS": "k1:9092,k2:9092", "CATALOG": "prod"})

    assert config.kafka["bootstrap.servers"] == "k1:9092,k2:9092"
    assert config.catalog["name"] == "prod"


def test_the_default_is_used_when_the_variable_is_unset(tmp_path: Path) -> None:
    text = MINIMAL.replace('"broker:9092"', '"${BROKERS:-127.0.0.1:9092}"')

    config = load(write(tmp_path, text), env={})

    assert config.kafka["bootstrap.servers"] == "127.0.0.1:9092"


def test_an_empty_default_is_allowed() -> None:
    assert interpolate("a${X:-}b", env={}) == "ab"


def test_the_process_environment_is_used_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_TEST_BROKERS", "from-env:9092")
    text = MINIMAL.replace('"broker:9092"', '"${INGEST_TEST_BROKERS}"')

    assert load(write(tmp_path, text)).kafka["bootstrap.servers"] == "from-env:9092"


def test_an_unset_variable_without_default_is_named_with_its_key_and_file(tmp_path: Path) -> None:
    text = MINIMAL.replace('"broker:9092"', '"${KAFKA_BROKERS_UNSET}"')
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as caught:
        load(path, env={})

    assert str(caught.value) == (
        f"{path}: kafka.bootstrap.servers: environment variable(s) KAFKA_BROKERS_UNSET referenced but not set"
    )


def test_catalog_values_may_be_numbers_and_booleans(tmp_path: Path) -> None:
    data = minimal()
    data["catalog"] |= {"port": 5432, "ssl": True, "timeout": 2.5}

    config = parse(data)

    assert (config.catalog["port"], config.catalog["ssl"], config.catalog["timeout"]) == ("5432", "true", "2.5")


def test_a_variable_inside_a_yaml_comment_is_not_interpolated(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'bootstrap.servers: "broker:9092"',
        'bootstrap.servers: "broker:9092"\n  # sasl.password: "${KAFKA_PASSWORD_UNSET}"',
    )

    config = load(write(tmp_path, text), env={})

    assert "sasl.password" not in config.kafka


def test_interpolated_values_are_not_parsed_as_yaml(tmp_path: Path) -> None:
    # a value that looks like YAML structure stays one string
    text = MINIMAL.replace('"broker:9092"', '"${BROKERS}"')

    config = load(write(tmp_path, text), env={"BROKERS": "a:1\nfoo: [bar]"})

    assert config.kafka["bootstrap.servers"] == "a:1\nfoo: [bar]"


def test_numbers_can_come_from_the_environment(tmp_path: Path) -> None:
    text = MINIMAL + 'batch:\n  max_records: "${MAX_RECORDS:-1000}"\n'

    assert load(write(tmp_path, text), env={}).batch.max_records == 1000
    with pytest.raises(ConfigError, match=r"batch\.max_records"):
        load(write(tmp_path, text), env={"MAX_RECORDS": "0"})


# --- relative paths ----------------------------------------------------------------------------


def with_catalog(uri: str, warehouse: str) -> str:
    return MINIMAL.replace("  name: lake\n", f'  name: lake\n  type: sql\n  uri: "{uri}"\n  warehouse: "{warehouse}"\n')


def test_relative_sqlite_uri_and_warehouse_resolve_against_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, with_catalog("sqlite:///../lake/catalog.db", "../lake"), name="conf/p.yaml")
    monkeypatch.chdir("/")  # the working directory must not matter

    config = load(path, env={})

    assert config.catalog["uri"] == f"sqlite:///{(tmp_path / 'lake' / 'catalog.db').resolve()}"
    assert config.catalog["warehouse"] == (tmp_path / "lake").resolve().as_uri()


def test_relative_paths_from_env_defaults_resolve_too(tmp_path: Path) -> None:
    text = with_catalog("${URI:-sqlite:///db/catalog.db}", "${WH:-wh}")

    config = load(write(tmp_path, text, name="conf/p.yaml"), env={})

    assert config.catalog["uri"] == f"sqlite:///{(tmp_path / 'conf' / 'db' / 'catalog.db').resolve()}"
    assert config.catalog["warehouse"] == (tmp_path / "conf" / "wh").resolve().as_uri()


def test_absolute_and_remote_locations_are_kept(tmp_path: Path) -> None:
    text = with_catalog("sqlite:////var/lib/catalog.db", "s3://bucket/warehouse")

    config = load(write(tmp_path, text), env={})

    assert config.catalog["uri"] == "sqlite:////var/lib/catalog.db"
    assert config.catalog["warehouse"] == "s3://bucket/warehouse"


def test_a_postgres_uri_is_kept(tmp_path: Path) -> None:
    text = with_catalog("postgresql+psycopg2://u:p@db/lake", "file:///srv/wh")

    config = load(write(tmp_path, text), env={})

    assert config.catalog["uri"] == "postgresql+psycopg2://u:p@db/lake"
    assert config.catalog["warehouse"] == "file:///srv/wh"


def test_an_in_memory_sqlite_catalog_is_kept(tmp_path: Path) -> None:
    # was: resolved like a relative file path, to sqlite:////<config dir>/:memory:
    config = load(write(tmp_path, with_catalog("sqlite:///:memory:", "wh")), env={})

    assert config.catalog["uri"] == "sqlite:///:memory:"


# --- redaction ---------------------------------------------------------------------------------


def test_redacted_masks_credentials_and_keeps_the_rest() -> None:
    data = minimal()
    data["kafka"].update({"sasl.username": "svc", "sasl.password": "hunter2", "sasl.jaas.config": "x pw=1"})
    data["catalog"].update({"s3.secret-access-key": "AKIA-SECRET", "token": "t0k", "uri": "sqlite:////c.db"})
    config = parse(data)

    shown = config.redacted()

    assert shown["kafka"]["sasl.password"] == "***"
    assert shown["kafka"]["sasl.jaas.config"] == "***"
    assert shown["catalog"]["s3.secret-access-key"] == "***"
    assert shown["catalog"]["token"] == "***"
    assert shown["kafka"]["sasl.username"] == "svc"
    assert shown["kafka"]["bootstrap.servers"] == "broker:9092"
    assert shown["catalog"]["uri"] == "sqlite:////c.db"
    assert "hunter2" not in repr(shown) and "AKIA-SECRET" not in repr(shown)
    assert shown["schema"][0]["name"] == "order_id"  # dumped by alias, as written in the file
    # the config itself still holds the real values
    assert config.kafka["sasl.password"] == "hunter2"


@pytest.mark.parametrize("hours", [0, 0.5])
def test_orphan_removal_has_a_floor_under_a_running_batchs_files(hours: float) -> None:
    data = minimal() | {"maintenance": {"orphan_age_hours": hours}}

    with pytest.raises(ConfigError, match=r"maintenance.orphan_age_hours: must be at least 1 hour") as caught:
        parse(data)
    assert caught.value.exit_code == ExitCode.CONFIG


def test_compaction_target_below_the_small_file_size_is_refused() -> None:
    data = minimal() | {"maintenance": {"small_file_mb": 64, "target_file_mb": 32}}

    with pytest.raises(ConfigError, match=r"target_file_mb must be at least small_file_mb"):
        parse(data)


@pytest.mark.parametrize("text", ["2026-12-01T00:00:00Z", "2026-12-01T01:00:00+01:00"])
def test_start_at_a_timestamp(text: str) -> None:
    data = minimal()
    data["start"] = text

    start = parse(data).start

    assert isinstance(start, datetime) and start.timestamp() == datetime(2026, 12, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("declared", "canonical"),
    [
        ("LONG", "long"),
        ("decimal( 12 , 2 )", "decimal(12,2)"),
        ("struct<City:string,zip : int>", "struct<City: string, zip: int>"),
        ("list< struct<a: list<long>> >", "list<struct<a: list<long>>>"),
    ],
)
def test_nested_types_are_parsed_and_kept_in_canonical_form(declared: str, canonical: str) -> None:
    data = minimal()
    data["schema"][1]["type"] = declared

    assert schema_of(parse(data))[1].type == canonical


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ("struct<a: long, a: int>", "appears twice"),
        ("struct<a long>", "expected ':'"),
        ("list<strng>", "unknown Iceberg type 'strng' in 'list<strng>'; did you mean 'string'?"),
        ("lnog", "(not for JSON values) map<key, value>"),
    ],
)
def test_a_bad_nested_type_is_refused_naming_the_field(declared: str, says: str) -> None:
    data = minimal()
    data["schema"][1]["type"] = declared

    assert says in error_of(data) and "schema[1] 'amount'.type" in error_of(data)


def test_a_map_is_refused_for_json_values_only() -> None:
    data = minimal()
    data["schema"][1]["type"] = "map<string, long>"
    name = data["schema"][1]["name"]

    assert f"schema: field {name!r}: map types cannot be read from JSON values" in error_of(data)
    data["topics"] = [{"name": "orders", "format": "avro"}]
    data["schema_registry"] = {"url": "http://127.0.0.1:8081"}
    assert schema_of(parse(data))[1].type == "map<string, long>"


def test_registry_formats_need_a_registry_and_may_omit_the_schema() -> None:
    data = minimal()
    data["topics"] = [{"name": "orders", "format": "avro"}]
    assert "needs `schema_registry:`" in error_of(data)
    data["schema_registry"] = {"url": "http://127.0.0.1:8081", "basic.auth.user.info": "me:secret"}
    del data["schema"]
    config = parse(data)
    assert config.schema_ is None and config.topics == ["orders"] and config.format == "avro"
    assert config.topic_specs[0].value_subject == "orders-value"
    assert config.on_schema_change == "evolve"
    assert config.redacted()["schema_registry"]["basic.auth.user.info"] == "***"


def test_json_topics_need_a_schema_and_formats_do_not_mix() -> None:
    data = minimal()
    del data["schema"]
    assert "JSON topics have no schema of their own" in error_of(data)
    data = minimal()
    data["topics"] = ["orders", {"name": "payments", "format": "avro"}]
    data["schema_registry"] = {"url": "http://127.0.0.1:8081"}
    assert "one pipeline reads one value format" in error_of(data)


def test_plain_avro_needs_no_registry_and_its_schema_file_is_relative_to_the_config(tmp_path: Path) -> None:
    data = minimal()
    del data["schema"]
    data["topics"] = [{"name": "orders", "format": "avro", "schema_file": "schemas/order.avsc"}]
    path = write(tmp_path, yaml.safe_dump(data), "conf/pipeline.yaml")
    config = load(path)
    assert config.schema_registry is None and config.schema_ is None
    assert config.schema_file == str(tmp_path / "conf" / "schemas" / "order.avsc")
    data["topics"] = [{"name": "orders", "format": "json", "schema_file": "x.avsc"}]
    assert "schema_file is for `format: avro` topics without a registry" in error_of(data)
    data["topics"] = [
        {"name": "a", "format": "avro", "schema_file": "x.avsc"},
        {"name": "b", "format": "avro", "schema_file": "y.avsc"},
    ]
    assert "the same schema_file" in error_of(data)


def test_unknown_fields_is_for_json_values() -> None:
    data = minimal()
    assert parse(data).unknown_fields == "drop"
    data["unknown_fields"] = "capture"
    assert parse(data).unknown_fields == "capture"
    data |= {"topics": [{"name": "orders", "format": "avro"}], "schema_registry": {"url": "http://127.0.0.1:8081"}}
    assert "unknown_fields: capture is for JSON values" in error_of(data)
    data["unknown_fields"] = "keep"
    assert "unknown_fields:" in error_of(data)


def test_refusing_timestamp_text_is_for_json_values_and_nan_for_any() -> None:
    data = minimal() | {"refuse": ["nan", "naive_timestamps"]}
    assert parse(data).refuse == ["nan", "naive_timestamps"]
    data |= {"topics": [{"name": "orders", "format": "avro"}], "schema_registry": {"url": "http://127.0.0.1:8081"}}
    assert "refuse: naive_timestamps is for JSON values" in error_of(data)
    data["refuse"] = ["nan"]
    assert parse(data).refuse == ["nan"]
    data["refuse"] = ["infinity"]
    assert "refuse[0]: Input should be" in error_of(data)


def test_metrics_need_somewhere_to_go() -> None:
    data = minimal() | {"metrics": {}}
    assert "metrics: give textfile, pushgateway or port" in error_of(data)
    data["metrics"] = {"textfile": "/var/lib/node_exporter/ingest.prom", "port": 9108}
    metrics = parse(data).metrics
    assert metrics is not None and metrics.job == "ingest"


# --- topics_pattern ----------------------------------------------------------------------------


def with_pattern(pattern: Any) -> dict[str, Any]:
    data = minimal()
    del data["topics"]
    data["topics_pattern"] = pattern
    return data


def test_a_topics_pattern_matches_whole_names_and_never_kafkas_own_topics() -> None:
    config = parse(with_pattern("orders_.*"))

    assert config.topics == [] and config.format == "json"
    assert [config.selects(t) for t in ("orders_eu", "orders", "x_orders_eu", "orders_eu.dlq")] == [
        True,
        False,
        False,
        True,
    ]
    assert not parse(with_pattern(".*")).selects("__consumer_offsets")
    assert config.topics_in(["orders_us", "payments", "orders_eu"]) == ["orders_eu", "orders_us"]
    # a listed pipeline's topics are its list, whatever a ledger holds
    assert parse(minimal()).topics_in(["payments"]) == ["orders"]


def test_a_topics_pattern_takes_an_encoding_like_a_topic() -> None:
    data = with_pattern({"pattern": "orders_.*", "format": "avro", "subject": "orders-value"})
    data["schema_registry"] = {"url": "http://registry:8081"}

    config = parse(data)

    assert config.format == "avro" and config.sources[0].value_subject == "orders-value"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (with_pattern("orders_("), "topics_pattern.pattern: 'orders_(' is not a regular expression"),
        ({**with_pattern("orders_.*"), "topics": ["orders"]}, "give the topics to read as `topics:` or as"),
        (
            {**with_pattern({"pattern": "o.*", "format": "avro"}), "schema_registry": {"url": "http://r:8081"}},
            "format 'avro' with a pattern needs `subject:`",
        ),
        ({k: v for k, v in minimal().items() if k != "topics"}, "topics: required key is missing (or give"),
    ],
)
def test_a_topics_pattern_is_checked(data: dict[str, Any], expected: str) -> None:
    assert expected in error_of(data)


def test_a_missing_topics_key_is_named_beside_other_errors() -> None:
    data = {k: v for k, v in minimal().items() if k != "topics"}
    data["batch"] = {"max_records": 0}

    message = error_of(data)

    assert "batch.max_records" in message and "topics: required key is missing" in message


# --- tables: (routing by topic) ------------------------------------------------------------------

ROUTED = textwrap.dedent(
    """\
    pipeline: shop
    kafka:
      bootstrap.servers: "broker:9092"
    catalog:
      name: lake
    unknown_fields: capture           # every table's, unless its entry says otherwise
    batch:
      max_records: 1000
    tables:
      - table: analytics.orders
        topics: [orders_eu, orders_us]
        schema:
          - {name: order_id, type: long, required: true}
          - {name: created_at, type: timestamptz}
        partition_by: ["day(created_at)"]
      - table: analytics.refunds
        topics: [refunds]
        unknown_fields: drop
        schema:
          - {name: refund_id, type: long}
      - table: analytics.other
        topics_pattern: "(orders|refunds)_.*"
        schema:
          - {name: id, type: long}
    """
)


def routed() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(ROUTED)
    return data


def test_tables_make_one_config_per_table_over_the_shared_keys() -> None:
    from ingest.config import parse_routes

    orders, refunds, other = parse_routes(routed())

    assert [r.table for r in (orders, refunds, other)] == ["analytics.orders", "analytics.refunds", "analytics.other"]
    assert {r.pipeline for r in (orders, refunds, other)} == {"shop"}
    assert orders.topics == ["orders_eu", "orders_us"] and orders.partition_by == ["day(created_at)"]
    assert (orders.unknown_fields, refunds.unknown_fields) == ("capture", "drop")
    assert refunds.batch.max_records == 1000 and refunds.dead_letters == "analytics.refunds_dead_letter"
    # a topic feeds one table: listed beats matched
    assert not other.selects("orders_eu") and other.selects("orders_asia") and other.selects("refunds_x")
    assert other.topics_in(["orders_eu", "orders_asia", "refunds"]) == ["orders_asia"]


def test_of_two_patterns_that_match_a_topic_the_first_entry_takes_it() -> None:
    from ingest.config import parse_routes

    data = routed()
    data["tables"][0] = {**data["tables"][0], "topics_pattern": "orders_.*"}
    del data["tables"][0]["topics"]
    data["tables"][1]["topics"] = ["orders_eu"]  # listed: its table's, whatever the patterns

    first, listing, second = parse_routes(data)

    assert (first.selects("orders_us"), second.selects("orders_us")) == (True, False)
    assert (first.selects("orders_eu"), listing.selects("orders_eu"), second.selects("orders_eu")) == (
        False,
        True,
        False,
    )
    assert (first.selects("refunds_1"), second.selects("refunds_1")) == (False, True)


def test_one_table_of_several_is_chosen_by_name() -> None:
    assert parse(routed(), "p.yaml", table="analytics.refunds").topics == ["refunds"]
    with pytest.raises(ConfigError, match=r"routes to 3 tables \(analytics.orders, .*\): name one with --table"):
        parse(routed(), "p.yaml")
    with pytest.raises(ConfigError, match=r"has no table 'analytics\.nope'; its tables: analytics\.orders"):
        parse(routed(), "p.yaml", table="analytics.nope")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(table="analytics.x"), "table: with `tables:`, each entry names its table and topics"),
        (
            lambda d: d["tables"][1].update(batch={"max_records": 5}),
            "tables[1] 'analytics.refunds'.batch: not a key of a table",
        ),
        (lambda d: d["tables"][1].update(topics=["orders_us"]), "topic 'orders_us' is listed by two entries"),
        (lambda d: d["tables"][2].update(table="analytics.orders"), "'analytics.orders' is listed twice"),
        (
            lambda d: d["tables"][1].update(dead_letter_table="analytics.orders"),
            "'analytics.orders' is the dead-letter table",
        ),
        (lambda d: d["tables"][0].pop("topics"), "tables[0] 'analytics.orders'.topics: required key is missing"),
        (
            lambda d: d["tables"][1]["schema"][0].update(type="lung"),
            "tables[1] 'analytics.refunds'.schema[0] 'refund_id'.type",
        ),
        (lambda d: d.update(tables=[]), "tables: a list of tables"),
    ],
)
def test_tables_are_checked_and_errors_name_the_entry(change: Any, expected: str) -> None:
    data = routed()
    change(data)

    assert expected in error_of(data)


def test_entries_paths_resolve_against_the_config_directory(tmp_path: Path) -> None:
    from ingest.config import load_routes

    data = routed()
    data["tables"][1]["topics"] = [{"name": "refunds", "format": "avro", "schema_file": "refund.avsc"}]
    del data["tables"][1]["schema"]
    path = write(tmp_path, yaml.safe_dump(data))

    refunds = load_routes(path)[1]

    assert refunds.schema_file == str(tmp_path / "refund.avsc")


# --- route_by ------------------------------------------------------------------------------------


def routed_by_value(**route: Any) -> dict[str, Any]:
    data = minimal()
    del data["table"]
    data["schema"].append({"name": "kind", "type": "string"})
    data["route_by"] = {"field": "kind", "table": "analytics.events_{value}", **route}
    return data


def test_route_by_puts_the_ledger_and_the_dead_letters_beside_the_routed_tables() -> None:
    config = parse(routed_by_value(allow=["click", "view"]))
    assert config.route_by is not None and config.route_by.table_of("click") == "analytics.events_click"
    assert (config.table, config.dead_letters) == ("analytics.orders_ledger", "analytics.orders_dead_letter")
    named = parse(routed_by_value(ledger_table="ops.events_offsets") | {"dead_letter_table": "ops.events_dead"})
    assert (named.table, named.dead_letters) == ("ops.events_offsets", "ops.events_dead")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"route_by": {"table": "analytics.events_{value}"}}, "give the value's place as `field:`"),
        ({"route_by": {"field": "kind", "header": "k", "table": "a.e_{value}"}}, "one of them"),
        ({"route_by": {"field": "kind", "table": "analytics.events"}}, "with {value} once in the name"),
        ({"route_by": {"field": "kind", "table": "{value}.events"}}, "with {value} once in the name"),
        ({"route_by": {"field": "kind", "table": "analytics.{value}"}}, "beside a fixed part"),
        ({"route_by": {"field": "kind", "table": "analytics.Events_{value}"}}, "has capitals"),
        ({"route_by": {"field": "kind", "table": "a.e_{value}", "allow": []}}, "at least 1 item"),
        ({"route_by": {"field": "kind", "table": "a.e_{value}", "allow": ["us\n"]}}, "cannot be part of a table"),
        ({"route_by": {"field": "amount", "table": "a.e_{value}"}}, "is a decimal(12,2); a table is named by"),
        ({"schema": [{"name": "_ingest_route", "type": "string"}]}, "a column the pipeline adds itself"),
        ({"route_by": {"field": "kind", "table": "a.e_{value}", "allow": ["a-b"]}}, "cannot be part of a table name"),
        ({"route_by": {"field": "nope", "table": "a.e_{value}"}}, "route_by.field: 'nope' is not a field of schema"),
        ({"table": "analytics.orders"}, "leave `table:` out"),
        ({"tables": [{"table": "a.b", "topics": ["x"]}]}, "route_by: a field's value picks the table"),
    ],
)
def test_route_by_errors_say_what_to_write(change: dict[str, Any], expected: str) -> None:
    data = routed_by_value()
    if "tables" in change:
        del data["topics"]
    data.update(change)
    assert expected in error_of(data)
