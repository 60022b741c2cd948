"""``route_by``: a field's (or a header's) value picks each record's table, tables created on first
use, against the real broker and catalogs: exact rows per table, dead letters for the values not
allowed, and ``verify``, after kills between the tables' commits and racing copies."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from ingest.assembly import open_pipeline
from tests.content import assert_holds
from tests.integration.conftest import BAD_VALUES, Env, MakeEnv, race

pytestmark = pytest.mark.integration

KINDS = ("click", "view", "buy")  # buy is not allowed: its records are dead letters


@dataclass
class RoutedByValue:
    """A pipeline routing one topic's records by their ``kind`` into ``<ns>.events_<kind>``."""

    env: Env
    produced: int = 0
    #: records expected per table (``dead``: the dead letters)
    expected: Counter[str] = field(default_factory=Counter)
    #: where each record goes, by its coordinates: the kind of its table, or ``dead``
    goes: dict[tuple[str, int, int], str] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.env.topic

    def table(self, kind: str) -> str:
        return f"{self.namespace}.events_{kind}"

    def produce(
        self, count: int, kinds: tuple[str, ...] = KINDS, poison_every: int = 0, by_header: bool = False
    ) -> None:
        batch = []
        goes = []
        for i in range(self.produced, self.produced + count):
            kind = kinds[i % len(kinds)]
            headers = [("kind", kind.encode())] if by_header else []
            if poison_every and i % poison_every == poison_every - 1:
                value = BAD_VALUES[i % len(BAD_VALUES)]
                goes.append("dead")
            else:
                body: dict[str, Any] = {"order_id": i, "amount": "1.50", "created_at": "2026-11-02T10:00:00Z"}
                if not by_header:
                    body["kind"] = kind
                value = json.dumps(body).encode()
                goes.append("dead" if kind == "buy" else kind)
            batch.append(((i // 7) % 3, f"k{i}".encode(), value, headers))  # each partition feeds each table
        self.env.send(self.env.topic, batch, [where == "dead" for where in goes])
        for sent, where in zip(self.env.log.sent[-count:], goes, strict=True):
            self.goes[sent.at] = where
            self.expected[where] += 1
        self.produced += count

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.env.cli(*args, env=env)

    def rows(self, kind: str) -> list[int]:
        """The offsets table ``kind`` holds (each once, if exactly once held)."""
        from ingest.iceberg.catalog import connect

        catalog = connect(self.env.config.catalog)
        table = catalog.load_table(self.table(kind))
        return sorted(table.scan(selected_fields=("_kafka_offset",)).to_arrow()["_kafka_offset"].to_pylist())

    def exact(self) -> None:
        """Every table holds exactly what was routed to it, and ``verify`` agrees."""
        for kind in ("click", "view"):
            assert len(self.rows(kind)) == self.expected[kind], kind
        assert self.env.counts()[1] == self.expected["dead"]
        data = self.env.verify()
        assert sum(p["rows"] + p["dead_letters"] for p in data["partitions"]) == self.produced

    def holds(self) -> None:
        """Each record is where it goes by content (tests/content.py): a ``click`` or ``view`` row in
        its table, a poison or ``buy`` record a dead letter (for tests whose tables take every row)."""
        from ingest.iceberg.catalog import connect

        catalog = connect(self.env.config.catalog)
        for kind in ("click", "view"):
            rows = catalog.load_table(self.table(kind)).scan().to_arrow()
            assert_holds(rows, None, [sent for sent in self.env.log.sent if self.goes[sent.at] == kind])
        assert_holds(None, open_pipeline(self.env.config).dead.table.scan().to_arrow(), self.env.log.sent)


def route(env: Env, **spec: Any) -> None:
    """Make ``env``'s config route by ``route`` (``route_by:``) into ``<topic>.events_{value}``."""
    data = yaml.safe_load(env.config_path.read_text())
    del data["table"]
    data["schema"] = [*data["schema"], {"name": "kind", "type": "string"}]
    data["route_by"] = {"table": f"{env.topic}.events_{{value}}", **spec}
    env.config_path.write_text(yaml.safe_dump(data))


@pytest.fixture
def by_value(make_env: MakeEnv) -> RoutedByValue:
    env: Env = make_env(partitions=3, batch={"max_records": 1_000, "read_timeout_s": 20})
    route(env, field="kind", allow=["click", "view"])
    return RoutedByValue(env)


def test_records_go_to_the_table_their_value_names_created_on_first_use(by_value: RoutedByValue) -> None:
    by_value.produce(1_200, kinds=("click",), poison_every=101)
    first = by_value.cli("run", "--until-caught-up", "--json")
    assert first.returncode == 0, first.stderr
    by_value.produce(1_800)  # view appears now: its table is created by the batch that first routes to it
    second = by_value.cli("run", "--until-caught-up", "--json")
    assert second.returncode == 0, second.stderr
    by_value.exact()
    status = json.loads(by_value.cli("status", "--json").stdout)
    assert status["table"] == f"{by_value.namespace}.orders_ledger" and status["lag"] == 0, status
    history = json.loads(by_value.cli("history", "--json").stdout)
    assert sum(entry["records"] for entry in history) == 3_000 - by_value.expected["dead"]
    assert by_value.cli("check").returncode == 0
    refused = by_value.cli("reset", "--to-earliest", "--reason", "x")
    assert refused.returncode == 78 and "route_by" in refused.stderr, refused.stderr


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_header_names_the_table_and_values_not_allowed_are_dead_letters_saying_why(make_env: MakeEnv) -> None:
    env: Env = make_env(partitions=3, batch={"max_records": 1_000, "read_timeout_s": 20})
    route(env, header="kind", allow=["click", "view"])
    by_header = RoutedByValue(env)
    by_header.produce(900, by_header=True, poison_every=89)
    by_header.produce(30, kinds=("",), by_header=True)  # an empty header names no table
    by_header.produce(20, kinds=("Click",), by_header=True)  # not allowed: allow compares values as they are

    run = by_header.cli("run", "--until-caught-up")

    assert run.returncode == 0, run.stderr
    by_header.expected["dead"] += 30 + 20
    by_header.exact()
    reasons = Counter(open_pipeline(env.config).dead.table.scan().to_arrow()["error"].to_pylist())
    assert reasons["route_by: header 'kind' is 'buy', not one of route_by.allow ['click', 'view']"] == 300 - 3
    assert reasons["route_by: the record has no header 'kind' to pick its table by"] == 30
    assert reasons["route_by: header 'kind' is 'Click', not one of route_by.allow ['click', 'view']"] == 20


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "point", ["files-written", "between-commits", "after-table#1", "after-table#2", "after-commit"]
)
def test_sigkill_between_the_tables_commits_then_rerun(by_value: RoutedByValue, point: str) -> None:
    by_value.produce(2_400, poison_every=37)

    killed = by_value.cli("run", env={"INGEST_FAILPOINT": point})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the first batch's rows are in the first table, or both, or neither, as the kill left them
    landed = [len(by_value.rows(kind)) for kind in ("click", "view") if _exists(by_value, kind)]
    tables_in = {"after-table#1": 1, "after-table#2": 2, "between-commits": 2, "after-commit": 2}
    assert sum(1 for n in landed if n) == tables_in.get(point, 0)
    rerun = by_value.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    by_value.exact()
    by_value.holds()


@pytest.mark.parametrize("catalog_kind", ["postgres"], indirect=True)  # (row locks, not SQLite's one writer)
def test_three_racing_copies_with_different_caps(by_value: RoutedByValue) -> None:
    by_value.produce(4_000, poison_every=53)
    paths = []
    for cap in (300, 500, 700):
        data = yaml.safe_load(by_value.env.config_path.read_text())
        data["batch"]["max_records"] = cap
        path = by_value.env.config_path.with_name(f"cap{cap}.yaml")
        path.write_text(yaml.safe_dump(data))
        paths.append(path)

    race(paths)

    final = by_value.cli("run", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    by_value.exact()
    by_value.holds()


def _exists(by_value: RoutedByValue, kind: str) -> bool:
    from ingest.iceberg.catalog import connect
    from ingest.iceberg.layout import exists

    return exists(connect(by_value.env.config.catalog), by_value.table(kind))


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_without_allow_each_value_names_a_table_in_lower_case(make_env: MakeEnv) -> None:
    env: Env = make_env(partitions=3, batch={"max_records": 1_000, "read_timeout_s": 20})
    route(env, field="kind")
    open_ended = RoutedByValue(env)
    open_ended.produce(600, kinds=("eu", "EU", "us-west"))  # us-west cannot be part of a table name

    run = open_ended.cli("run", "--until-caught-up")

    assert run.returncode == 0, run.stderr
    assert len(open_ended.rows("eu")) == 400  # eu and EU: one table, as Glue and Hive would have it anyway
    assert open_ended.env.counts()[1] == 200
    assert not _exists(open_ended, "us_west")
    open_ended.env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_maintain_compacts_and_expires_every_routed_table_keeping_the_floors(by_value: RoutedByValue) -> None:
    data = yaml.safe_load(by_value.env.config_path.read_text())
    data["maintenance"] = {"snapshot_retention_hours": 0, "keep_last_snapshots": 1}
    by_value.env.config_path.write_text(yaml.safe_dump(data))
    by_value.produce(3_000, poison_every=43)
    assert by_value.cli("run", "--until-caught-up").returncode == 0  # three batches: three snapshots a table

    maintained = by_value.cli("maintain", "--json")

    assert maintained.returncode == 0, maintained.stderr
    done = json.loads(maintained.stdout)
    routed = done["routed_tables"]
    assert set(routed) == {by_value.table("click"), by_value.table("view")}
    assert all(t["files_removed"] > 1 and t["snapshots_expired"] >= 2 for t in routed.values()), routed
    by_value.produce(900, poison_every=43)
    assert by_value.cli("run", "--until-caught-up").returncode == 0
    by_value.exact()


def _reasons(env: Env) -> Counter[str]:
    return Counter(open_pipeline(env.config).dead.table.scan().to_arrow()["error"].to_pylist())


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("differs", "says"),
    [
        ("partitioning", "the table is partitioned by [], the config says [day(created_at)]"),
        ("schema", "cannot take the configured schema: Cannot change column type: amount: string -> decimal(12, 2)"),
    ],
)
def test_a_table_that_cannot_take_the_rows_gets_dead_letters_saying_why_until_it_is_fixed(
    by_value: RoutedByValue, differs: str, says: str
) -> None:
    from ingest.iceberg.catalog import connect
    from ingest.iceberg.layout import evolve_spec, open_table
    from ingest.iceberg.schema import partition_spec, rows_schema
    from ingest.records import Field

    env = by_value.env
    catalog = connect(env.config.catalog)
    # another tool created events_view first: unpartitioned (the config partitions by day(created_at)),
    # or with amount as text (the config's is a decimal)
    fields = [Field(f.name, f.type, f.required) for f in env.config.schema_ or []]
    if differs == "schema":
        fields = [Field(f.name, "string", f.required) if f.name == "amount" else f for f in fields]
    schema = rows_schema(fields)
    spec = partition_spec(schema, ["day(created_at)"]) if differs == "schema" else None
    view = open_table(catalog, by_value.table("view"), schema, spec)
    by_value.produce(1_200, poison_every=97)

    run = by_value.cli("run", "--until-caught-up")

    assert run.returncode == 0, run.stderr
    refused = by_value.expected.pop("view")
    by_value.expected["dead"] += refused
    assert len(by_value.rows("click")) == by_value.expected["click"] and not by_value.rows("view")
    reason = [reason for reason in _reasons(env) if by_value.table("view") in reason]
    assert len(reason) == 1 and _reasons(env)[reason[0]] == refused, _reasons(env)
    assert reason[0].startswith(f"route_by: field 'kind' is 'view', which names {by_value.table('view')}"), reason
    assert says in reason[0], reason
    env.verify()

    if differs == "partitioning":  # fixed: records read from now on go into it
        evolve_spec(view, ["day(created_at)"])
    else:  # dropped: the pipeline creates it as the config says
        catalog.drop_table(by_value.table("view"))
    by_value.produce(900, poison_every=97)
    again = by_value.cli("run", "--until-caught-up")

    assert again.returncode == 0, again.stderr
    by_value.exact()
    assert by_value.expected["view"] > 250 and _reasons(env)[reason[0]] == refused  # (exact: they are in it)


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_routed_table_another_tool_changed_takes_dead_letters_and_keeps_its_rows_counted(make_env: MakeEnv) -> None:
    env: Env = make_env(
        partitions=3,
        batch={"max_records": 1_000, "read_timeout_s": 20},
        table_properties={"write.parquet.compression-codec": "zstd"},
    )
    route(env, field="kind", allow=["click", "view"])
    by_value = RoutedByValue(env)
    by_value.produce(900)
    assert by_value.cli("run", "--until-caught-up").returncode == 0
    from ingest.iceberg.catalog import connect

    clicks = connect(env.config.catalog).load_table(by_value.table("click"))
    with clicks.transaction() as change:  # as Spark's ALTER TABLE ... SET TBLPROPERTIES would
        change.set_properties({"write.parquet.compression-codec": "snappy"})
    landed = by_value.expected["click"]
    by_value.produce(900)

    run = by_value.cli("run", "--until-caught-up")

    assert run.returncode == 0, run.stderr
    assert len(by_value.rows("click")) == landed and len(by_value.rows("view")) == by_value.expected["view"]
    says = [reason for reason in _reasons(env) if by_value.table("click") in reason]
    assert len(says) == 1 and _reasons(env)[says[0]] == by_value.expected["click"] - landed, _reasons(env)
    assert "write.parquet.compression-codec = 'snappy' (config: 'zstd')" in says[0], says
    env.verify()  # the rows the table held before it was changed still count
    check = by_value.cli("check", "--json")
    assert check.returncode == 0, check.stderr
    assert f"records routed to {by_value.table('click')} are dead letters until it can take them" in check.stdout


@pytest.mark.parametrize("catalog_kind", ["sqlite"], indirect=True)
def test_a_table_refused_after_a_kill_past_its_commit_keeps_what_it_holds_and_nothing_twice(make_env: MakeEnv) -> None:
    env: Env = make_env(
        partitions=3,
        batch={"max_records": 1_000, "read_timeout_s": 20},
        table_properties={"write.parquet.compression-codec": "zstd"},
    )
    route(env, field="kind", allow=["click", "view"])
    by_value = RoutedByValue(env)
    by_value.produce(2_400, poison_every=37)
    killed = by_value.cli("run", env={"INGEST_FAILPOINT": "after-table#1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    held = by_value.rows("click")  # the first batch's, below the table's floor; the ledger did not move
    assert held
    from ingest.iceberg.catalog import connect

    with connect(env.config.catalog).load_table(by_value.table("click")).transaction() as change:
        change.set_properties({"write.parquet.compression-codec": "snappy"})

    rerun = by_value.cli("run", "--until-caught-up")

    assert rerun.returncode == 0, rerun.stderr
    assert by_value.rows("click") == held  # read again, and neither added nor set aside
    assert len(by_value.rows("view")) == by_value.expected["view"]
    assert env.counts()[1] == by_value.expected["dead"] + by_value.expected["click"] - len(held)
    env.verify()
