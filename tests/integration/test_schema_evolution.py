"""Schema evolution from the config, committed with the batch: a column added to ``schema:``, a
required field relaxed, a type widened. The evolution goes into the same snapshot as the batch's
data and ledger, never alone; a change the table cannot take stops the run before anything moves.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
import yaml
from pyiceberg.table import Table

from ingest.failpoints import POINTS
from ingest.iceberg.catalog import connect
from ingest.intents import Append
from ingest.kafka.admin import produce
from tests.integration.conftest import Env, KafkaRecord, MakeEnv

pytestmark = pytest.mark.integration


def _schema(env: Env, *fields: dict[str, Any], relax: str | None = None) -> None:
    """Add ``fields`` to the config's ``schema:``, and make ``relax`` optional."""
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [dict(f, required=False) if f["name"] == relax else f for f in data["schema"]] + list(fields)
    env.config_path.write_text(yaml.safe_dump(data))


def _orders(env: Env, count: int, **extra: Any) -> None:
    """Orders ``env.produced..+count`` with ``extra`` fields (a callable gets the order id)."""
    start = env.produced
    records: list[KafkaRecord] = []
    for i in range(start, start + count):
        value = {"order_id": i, "amount": f"{i}.50", "created_at": "2026-12-01T10:00:00Z"}
        value |= {k: (v(i) if callable(v) else v) for k, v in extra.items()}
        records.append((i % env.partitions, f"k{i}".encode(), json.dumps(value).encode(), []))
    produce(env.bootstrap, env.topic, records)
    env.produced += count


def _table(env: Env) -> Table:
    """The rows table as the catalog has it (opening a pipeline would evolve nothing, but may refuse)."""
    config = env.config
    return connect(config.catalog).load_table(config.table)


def test_columns_added_relaxed_and_widened_evolve_in_the_batchs_own_snapshot(make_env: MakeEnv) -> None:
    env = make_env(partitions=2, batch={"chunk_records": 10, "workers": 2})  # a worker process writes too
    _orders(env, 100, note="ignored while the schema lacks it")
    assert env.cli("run").returncode == 0
    before = _table(env)
    assert [f.name for f in before.schema().fields][-1] == "created_at"

    _schema(env, {"name": "note", "type": "string"}, {"name": "qty", "type": "int"})
    _orders(env, 50, note=lambda i: f"n{i}", qty=lambda i: i)
    first = env.cli("run", "--json")

    assert first.returncode == 0, first.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == len(before.metadata.snapshots) + 1  # data, ledger and schema: one
    head = table.current_snapshot()
    assert head is not None and head.schema_id == table.schema().schema_id != before.schema().schema_id
    note, qty = table.schema().find_field("note"), table.schema().find_field("qty")
    assert (str(note.field_type), note.required, str(qty.field_type)) == ("string", False, "int")
    rows = table.scan(selected_fields=("order_id", "note", "qty")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["note"] for r in rows[:100]] == [None] * 100  # written before the column existed
    assert rows[100:] == [{"order_id": i, "note": f"n{i}", "qty": i} for i in range(100, 150)]
    env.verify()

    _schema(env, {"name": "qty", "type": "long"}, relax="order_id")  # int→long, required→optional
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [f for i, f in enumerate(data["schema"]) if f["name"] != "qty" or i == len(data["schema"]) - 1]
    env.config_path.write_text(yaml.safe_dump(data))
    _orders(env, 50, note="big", qty=lambda i: i + 2**40)

    assert env.cli("run").returncode == 0

    table = _table(env)
    widened = table.schema()
    assert str(widened.find_field("qty").field_type) == "long" and widened.find_field("qty").field_id == qty.field_id
    assert not widened.find_field("order_id").required
    quantities = table.scan(selected_fields=("order_id", "qty")).to_arrow().sort_by("order_id")["qty"].to_pylist()
    assert quantities == [None] * 100 + list(range(100, 150)) + [i + 2**40 for i in range(150, 200)]
    assert env.counts() == (200, 0)
    env.verify()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"name": "order_id", "type": "string", "required": True},
            "Cannot change column type: order_id: long -> string",
        ),
        ({"name": "region", "type": "string", "required": True}, "cannot add required column: region"),
    ],
)
def test_a_change_the_table_cannot_take_stops_before_anything_moves(
    make_env: MakeEnv, change: dict[str, Any], says: str
) -> None:
    env = make_env(partitions=1)
    _orders(env, 20)
    assert env.cli("run").returncode == 0
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [f for f in data["schema"] if f["name"] != change["name"]] + [change]
    env.config_path.write_text(yaml.safe_dump(data))
    before = _table(env).metadata
    _orders(env, 20)

    result = env.cli("run")

    assert result.returncode == 65, result.stderr
    assert says in result.stderr and "fix `schema:`" in result.stderr, result.stderr
    after = _table(env).metadata
    assert (after.current_schema_id, len(after.snapshots)) == (before.current_schema_id, len(before.snapshots))


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_step_of_an_evolving_batch_leaves_schema_and_data_together(
    make_env: MakeEnv, point: str
) -> None:
    env = make_env(partitions=2)
    _orders(env, 100)
    assert env.cli("run").returncode == 0
    old = _table(env).schema()
    _schema(env, {"name": "note", "type": "string"})
    _orders(env, 100, note=lambda i: f"n{i}")

    killed = env.cli("run", env={"INGEST_FAILPOINT": point})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    table = _table(env)
    committed = point in ("between-commits", "after-commit")  # the rows commit decides; dead letters follow
    assert len(table.metadata.snapshots) == 1 + committed
    assert (table.schema() == old) is not committed  # the new column came with the batch, or not at all
    rerun = env.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    notes = _table(env).scan(selected_fields=("order_id", "note")).to_arrow().sort_by("order_id")["note"].to_pylist()
    assert notes == [None] * 100 + [f"n{i}" for i in range(100, 200)]
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_files_written_for_an_evolution_another_writer_overtook_are_never_committed(make_env: MakeEnv) -> None:
    import pyarrow as pa
    from pyiceberg.types import StringType

    from ingest.assembly import open_pipeline
    from ingest.errors import SchemaMoved

    env = make_env(partitions=1)
    _orders(env, 10)
    assert env.cli("run").returncode == 0
    _schema(env, {"name": "note", "type": "string"})
    rows = open_pipeline(env.config).rows  # will add `note` with the next commit
    written = rows.detached().table.schema()
    files = rows.write(pa.Table.from_pylist([{}], schema=written.as_arrow()).drop_null())  # shape only
    assert written.find_field("note").field_id == 1 + _table(env).metadata.last_column_id
    other = _table(env)  # another tool adds a different column first: it takes the id `note` was written with
    with other.update_schema() as update:
        update.add_column("region", StringType())
    rows.refresh()

    with pytest.raises(SchemaMoved, match="changed while this batch's files were written"):
        rows.commit(Append(files, {}))

    assert _table(env).schema().find_field("region").field_id == written.find_field("note").field_id
    _orders(env, 10, note=lambda i: f"n{i}")
    assert env.cli("run").returncode == 0  # the next run evolves from the table as it now is
    schema = _table(env).schema()
    assert schema.find_field("note").field_id == schema.find_field("region").field_id + 1
    assert env.counts() == (20, 0)
    env.verify()


def test_nested_fields_land_in_iceberg_and_a_field_added_inside_a_struct_evolves(make_env: MakeEnv) -> None:
    env = make_env(partitions=1)
    _schema(env, {"name": "addr", "type": "struct<city: string>"}, {"name": "tags", "type": "list<string>"})
    _orders(env, 10, addr=lambda i: {"city": f"c{i}", "zip": i}, tags=lambda i: [f"t{i}"] * (i % 3))
    assert env.cli("run").returncode == 0
    city = _table(env).schema().find_field("addr.city")

    _schema(env)  # addr gains zip: a new optional field inside the struct
    data = yaml.safe_load(env.config_path.read_text())
    for field in data["schema"]:
        if field["name"] == "addr":
            field["type"] = "struct<city: string, zip: int>"
    env.config_path.write_text(yaml.safe_dump(data))
    _orders(env, 10, addr=lambda i: {"city": f"c{i}", "zip": i}, tags=lambda i: [f"t{i}"])

    assert env.cli("run").returncode == 0

    table = _table(env)
    assert table.schema().find_field("addr.city").field_id == city.field_id  # identity by id, not position
    assert str(table.schema().find_field("addr.zip").field_type) == "int"
    rows = table.scan(selected_fields=("order_id", "addr", "tags")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["addr"] for r in rows] == [{"city": f"c{i}", "zip": None} for i in range(10)] + [
        {"city": f"c{i}", "zip": i} for i in range(10, 20)
    ]
    assert [r["tags"] for r in rows[:3]] == [[], ["t1"], ["t2", "t2"]]
    assert env.counts() == (20, 0)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_required_field_relaxed_after_a_rollback_reads_its_dead_letters_again_as_rows_exactly_once(
    make_env: MakeEnv,
) -> None:
    """Records with a null ``note`` are dead letters while ``note`` is required. The operator
    relaxes it and rolls main back to before them: the re-read lands every one of them as a row,
    once, and none stays a dead letter; the relaxation rides with the first batch after the rollback."""
    env = make_env(partitions=2)
    _schema(env, {"name": "note", "type": "string", "required": True})
    _orders(env, 60, note=lambda i: f"n{i}")
    assert env.cli("run").returncode == 0
    head = _table(env).current_snapshot()
    assert head is not None
    snapshot_s = head.snapshot_id
    _orders(env, 300, note=lambda i: None if i % 3 == 0 else f"n{i}")
    assert env.cli("run", "--until-caught-up").returncode == 0
    assert env.counts() == (260, 100)

    _schema(env, relax="note")
    rollback = env.cli("replay", "--from-snapshot", str(snapshot_s), "--rollback", "--json")
    assert rollback.returncode == 0, rollback.stderr
    rerun = env.cli("run", "--until-caught-up")

    assert rerun.returncode == 0, rerun.stderr
    assert env.counts() == (360, 0)
    table = _table(env)
    assert not table.schema().find_field("note").required
    rows = table.scan(selected_fields=("order_id", "note")).to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == list(range(360))
    assert [r["note"] for r in rows] == [None if i >= 60 and i % 3 == 0 else f"n{i}" for i in range(360)]
    env.verify()


def _rename_qty(env: Env) -> None:
    """The writers renamed ``qty`` to ``quantity``: ``schema:`` says the new name, ``renames:`` the old."""
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [dict(f, name="quantity") if f["name"] == "qty" else f for f in data["schema"]]
    data["renames"] = {"qty": "quantity"}
    env.config_path.write_text(yaml.safe_dump(data))


def test_a_column_renamed_by_config_keeps_its_field_id_and_takes_records_of_either_name(make_env: MakeEnv) -> None:
    env = make_env(partitions=2)
    _schema(env, {"name": "qty", "type": "int"})
    _orders(env, 50, qty=lambda i: i)
    assert env.cli("run").returncode == 0
    before = _table(env)
    qty = before.schema().find_field("qty")

    _rename_qty(env)
    _orders(env, 30, quantity=lambda i: i)
    _orders(env, 20, qty=lambda i: i)  # producers not yet upgraded
    renamed = env.cli("run", "--until-caught-up")

    assert renamed.returncode == 0, renamed.stderr
    table = _table(env)
    assert len(table.metadata.snapshots) == len(before.metadata.snapshots) + 1  # rename, data and ledger: one
    head = table.current_snapshot()
    assert head is not None and head.schema_id == table.schema().schema_id
    quantity = table.schema().find_field("quantity")
    assert (quantity.field_id, str(quantity.field_type)) == (qty.field_id, "int")
    assert "qty" not in table.schema().column_names
    rows = table.scan(selected_fields=("order_id", "quantity")).to_arrow().sort_by("order_id").to_pylist()
    assert rows == [{"order_id": i, "quantity": i} for i in range(100)]  # rows written as qty read as quantity
    assert env.cli("run").returncode == 0  # the rename is done: nothing more to change
    assert len(_table(env).metadata.schemas) == len(table.metadata.schemas)
    env.verify()


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
def test_a_rename_onto_a_column_that_already_landed_stops_before_anything_moves(make_env: MakeEnv) -> None:
    env = make_env(partitions=1)
    _schema(env, {"name": "qty", "type": "int"}, {"name": "quantity", "type": "int"})
    _orders(env, 10, qty=1)
    assert env.cli("run").returncode == 0
    data = yaml.safe_load(env.config_path.read_text())
    data["schema"] = [f for f in data["schema"] if f["name"] != "qty"]
    data["renames"] = {"qty": "quantity"}
    env.config_path.write_text(yaml.safe_dump(data))
    before = _table(env).metadata

    result = env.cli("run")

    assert result.returncode == 65, result.stderr
    assert "has both qty and quantity" in result.stderr, result.stderr
    after = _table(env).metadata
    assert (after.current_schema_id, len(after.snapshots)) == (before.current_schema_id, len(before.snapshots))


@pytest.mark.parametrize("catalog_kind", ["sqlite"])
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_step_of_a_renaming_batch_leaves_the_name_and_the_data_together(
    make_env: MakeEnv, point: str
) -> None:
    env = make_env(partitions=2)
    _schema(env, {"name": "qty", "type": "int"})
    _orders(env, 40, qty=lambda i: i)
    assert env.cli("run").returncode == 0
    _rename_qty(env)
    _orders(env, 40, quantity=lambda i: i)

    killed = env.cli("run", env={"INGEST_FAILPOINT": point})

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    committed = point in ("between-commits", "after-commit")  # the rows commit decides; dead letters follow
    assert ("quantity" in _table(env).schema().column_names) is committed  # renamed with the batch, or not at all
    rerun = env.cli("run", "--until-caught-up")
    assert rerun.returncode == 0, rerun.stderr
    rows = _table(env).scan(selected_fields=("order_id", "quantity")).to_arrow().sort_by("order_id").to_pylist()
    assert rows == [{"order_id": i, "quantity": i} for i in range(80)]
    env.verify()
