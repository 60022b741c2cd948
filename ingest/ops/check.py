"""``ingest check``: everything a run checks before its first side effect, changing nothing.

In order, each step only if the ones it needs passed: the config (loaded before this module is
called); Kafka (librdkafka's properties, the brokers, the topics); the Schema Registry (the subjects
the table's schema or key column come from); the catalog; the tables (an existing one's schema and
partition spec against the config, as a run would evolve or refuse them; a missing one's layout, as
the first run would create it). A failed step says what is wrong and how to fix it, and the command
exits with its code (78 for a configuration mistake, 75 for what may heal, 65 for a table that does
not fit).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.assembly import layout, open_pipeline
from ingest.config import PipelineConfig
from ingest.errors import ConfigError, ExitCode, IngestError
from ingest.format_names import REGISTRY_FORMATS
from ingest.iceberg.catalog import absent, check_type, connect
from ingest.iceberg.layout import exists
from ingest.kafka.settings import RESPONSE_OVERHEAD, receive_limit
from ingest.kafka.source import KafkaSource
from ingest.records import KEY_COLUMN


def fits(limit: int, accepted: Mapping[str, int]) -> None:
    """Refuse a consumer receive limit below a record batch a topic accepts (``accepted``: each
    topic's ``max.message.bytes``): a run stops at such a batch (exit 78), so it is refused before."""
    over = {topic: size for topic, size in accepted.items() if size + RESPONSE_OVERHEAD > limit}
    if not over:
        return
    needed = max(over.values()) + RESPONSE_OVERHEAD
    listed = ", ".join(f"{topic!r} (max.message.bytes {size:,})" for topic, size in sorted(over.items()))
    topics = f"topic {listed} accepts" if len(over) == 1 else f"topics {listed} accept"
    default = " (or leave it out: librdkafka's default is 100,000,000)" if receive_limit({}) >= needed else ""
    raise ConfigError(
        f"kafka.receive.message.max.bytes: the consumer takes responses of up to {limit:,} bytes, but {topics} "
        "record batches that come in larger ones: `ingest run` would stop at such a batch (exit 78). "
        f"Raise receive.message.max.bytes in `kafka:` to at least {needed:,}{default}."
    )


@dataclass(frozen=True)
class Step:
    """One check: what was checked, and what was found (or why it failed)."""

    name: str
    ok: bool
    detail: str
    exit_code: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class CheckResult:
    pipeline: str
    steps: tuple[Step, ...]

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps)

    @property
    def exit_code(self) -> int:
        return next((step.exit_code for step in self.steps if not step.ok), int(ExitCode.OK))

    def as_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "ok": self.ok, "steps": [s.as_dict() for s in self.steps]}


def check(config: PipelineConfig) -> CheckResult:
    steps: list[Step] = []

    def step(name: str, action: Callable[[], str]) -> bool:
        try:
            steps.append(Step(name, True, action()))
        except IngestError as error:
            steps.append(Step(name, False, str(error), int(error.exit_code)))
            return False
        return True

    def kafka() -> str:
        source = KafkaSource(config.kafka, config.subscription, config.group_id, config.batch.read_timeout_s)
        limit = source.check_clients()  # the consumer a run reads with: what librdkafka refuses there, it refuses here
        view = source.describe()
        held = sum(wm.high - wm.low for wm in view.partitions.values())
        topics = sorted({tp.topic for tp in view.partitions})
        fits(limit, source.max_message_bytes(topics))
        matching = f" (matching {config.topics_pattern.pattern!r})" if config.topics_pattern is not None else ""
        return f"{len(view.partitions)} partitions of {', '.join(topics) or 'no topic'}{matching}; {held} records held"

    def registry() -> str:
        from ingest.kafka.registry import Registry

        client = Registry(config.schema_registry or {})
        subjects = []
        for topic in config.sources:
            values = topic.format in REGISTRY_FORMATS and topic.schema_file is None
            if values and (config.schema_ is None or config.on_schema_change == "evolve"):  # as a run reads them
                subjects.append(topic.value_subject)
            if topic.key_format in REGISTRY_FORMATS:
                subjects.append(topic.key_subject_name)
        found = [f"{s} (schema id {client.latest(s).schema_id})" for s in subjects]
        return f"{client.url}: " + (", ".join(found) if found else "reachable")

    file = absent(config.catalog)

    def catalog() -> str:
        check_type(config.catalog)
        if file is not None:
            return f"{config.catalog['name']}: its SQLite database {file} does not exist yet; the first run creates it"
        connect(config.catalog, config.commit.request_timeout_s)
        return f"{config.catalog['name']} ({config.catalog.get('type', 'its uri says which')} catalog, reachable)"

    def tables() -> str:
        catalog = connect(config.catalog, config.commit.request_timeout_s) if file is None else None
        names = (config.table, config.dead_letters)
        there = {t: catalog is not None and exists(catalog, t) for t in names}
        if all(there.values()):
            pipeline = open_pipeline(config)  # loads, and stages what the next batch would evolve: commits nothing
            columns = [f.name for f in pipeline.fields]
            refused = pipeline.routes.refused if pipeline.routes is not None else {}
            return (
                f"{config.table} and {config.dead_letters} exist and fit the config ({len(columns)} columns"
                f"{', a key column' if KEY_COLUMN in columns else ''}; partition spec as configured)"
                + "".join(
                    f"; records routed to {name} are dead letters until it can take them: {why}"
                    for name, why in sorted(refused.items())
                )
            )
        planned = layout(
            config, catalog_absent=file is not None
        )  # the columns and the partition transforms, checked against each other
        spec = f"partitioned by {', '.join(config.partition_by)}" if config.partition_by else "unpartitioned"
        missing = [t for t, found in there.items() if not found]
        return (
            f"not created yet: {', '.join(missing)}; the first run creates them, {config.table} with "
            f"{len(planned.fields)} columns, {spec}"
        )

    reachable = step("kafka", kafka)
    uses_registry = config.key_format in REGISTRY_FORMATS or (
        config.format in REGISTRY_FORMATS and config.schema_file is None
    )
    if uses_registry:
        reachable = step("schema registry", registry) and reachable
    if step("catalog", catalog) and reachable:
        step("tables", tables)
    return CheckResult(config.pipeline, tuple(steps))
