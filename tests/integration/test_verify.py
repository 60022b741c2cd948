"""``ingest verify`` on real tables another writer changed after the pipeline's last batch: it
judges what readers see (each table's head), exits 65 naming the offsets and the kind of problem,
and names the snapshot that made it; changes that keep the rows leave it at 0."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from ingest.assembly import Opened, open_pipeline
from ingest.render import PROBLEM_WORDS
from tests.integration.conftest import Env, MakeEnv

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("catalog_kind", ["sqlite"])]

#: a terminal wide enough that no cell of verify's table wraps
WIDE = {"COLUMNS": "250"}


def _offsets(table: Table, column: str) -> list[int]:
    return sorted(table.scan(selected_fields=(column,)).to_arrow()[column].to_pylist())


def _at(table: Table, column: str, offset: int, moved_to: int | None = None) -> pa.Table:
    """The record of ``table`` at ``offset`` (one partition), its offset set to ``moved_to`` if given."""
    found = table.scan(row_filter=f"{column} = {offset}").to_arrow().slice(0, 1)
    if moved_to is None:
        return found
    index = found.schema.get_field_index(column)
    return found.set_column(index, found.schema.field(index), pa.array([moved_to], pa.int64()))


#: another writer's change after the last batch (given the rows and dead-letter tables, the good and
#: poison offsets): which problem verify must report, at which offset
Corruption = Callable[[Table, Table, list[int], list[int]], tuple[str, int]]


def _delete_a_row(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    rows.delete(f"_kafka_offset = {good[5]}")
    return "missing", good[5]


def _append_a_row_past_the_ledger(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    past = max(good + poison) + 5
    rows.append(_at(rows, "_kafka_offset", good[0], moved_to=past))
    return "unexpected", past


def _copy_a_row(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    rows.append(_at(rows, "_kafka_offset", good[3]))
    return "duplicated", good[3]


def _copy_a_dead_letter(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    dead.append(_at(dead, "offset", poison[1]))
    return "duplicated_dead_letters", poison[1]


def _make_a_dead_letter_a_row_too(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    rows.append(_at(rows, "_kafka_offset", good[0], moved_to=poison[2]))
    return "in_both_tables", poison[2]


def _drop_a_dead_letter(rows: Table, dead: Table, good: list[int], poison: list[int]) -> tuple[str, int]:
    dead.delete(f"offset = {poison[0]}")
    return "missing", poison[0]


CORRUPTIONS: dict[str, Corruption] = {
    "a row deleted": _delete_a_row,
    "a row appended past the ledger": _append_a_row_past_the_ledger,
    "a row appended twice": _copy_a_row,
    "a dead letter appended twice": _copy_a_dead_letter,
    "a dead letter's record appended as a row": _make_a_dead_letter_a_row_too,
    "a dead letter deleted": _drop_a_dead_letter,
}


def _caught_up(make_env: MakeEnv) -> tuple[Env, Opened]:
    env: Env = make_env(partitions=1, batch={"max_records": 15, "read_timeout_s": 20})
    env.produce(40, bad_every=5)
    assert env.cli("run", "--until-caught-up").returncode == 0
    env.verify()
    return env, open_pipeline(env.config)


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_verify_fails_on_each_kind_of_corruption_after_the_last_batch_naming_offsets_and_snapshot(
    make_env: MakeEnv, corrupt: Corruption
) -> None:
    env, pipeline = _caught_up(make_env)
    rows, dead = pipeline.rows.table, pipeline.dead.table
    good, poison = _offsets(rows, "_kafka_offset"), _offsets(dead, "offset")
    assert len(poison) == env.bad == 8
    before = {s.snapshot_id for t in (rows, dead) for s in t.refresh().snapshots()}

    kind, offset = corrupt(rows, dead, good, poison)

    by_corruption = {s.snapshot_id for t in (rows, dead) for s in t.refresh().snapshots()} - before
    failed = env.cli("verify", "--json")
    assert failed.returncode == 65, (failed.stdout, failed.stderr)
    (document,) = failed.stdout.splitlines()
    data = json.loads(document)
    (partition,) = data["partitions"]
    assert data["ok"] is False and partition["ok"] is False
    assert {k: partition[k] for k in PROBLEM_WORDS if partition[k]} == {kind: [offset]}
    head = rows.current_snapshot()
    assert head is not None and data["head_snapshot_id"] == head.snapshot_id
    (change,) = data["changed_by_other_writers"]
    assert change["snapshot_id"] in by_corruption and offset in change["removed"] + change["added"]

    said = env.cli("verify", env=WIDE)

    assert said.returncode == 65 and "verification failed" in said.stderr
    text = " ".join(said.stdout.split())
    assert f"{PROBLEM_WORDS[kind]} [{offset}]" in text
    verb = "removed" if change["removed"] else "added"
    assert f"at offsets [{offset}] {verb} by another writer's snapshot {change['snapshot_id']}" in text


def test_compaction_and_another_pipelines_rows_after_the_last_batch_keep_verify_ok(make_env: MakeEnv) -> None:
    env, pipeline = _caught_up(make_env)
    assert env.cli("maintain").returncode == 0  # ingest maintain's compaction: it carries the ledger on
    rows = pipeline.rows.table.refresh()
    rows.overwrite(rows.scan().to_arrow())  # another engine's compaction: the same rows, no ledger
    foreign = _at(rows, "_kafka_offset", 0).to_pylist()[0] | {"_kafka_topic": "elsewhere"}
    rows.append(pa.Table.from_pylist([foreign], schema=rows.schema().as_arrow()))  # another pipeline's row

    checked = env.verify()

    head = rows.current_snapshot()
    assert head is not None and checked["head_snapshot_id"] == head.snapshot_id != checked["snapshot_id"]
    assert checked["changed_by_other_writers"] == []
    assert sum(p["rows"] for p in checked["partitions"]) == 40 - env.bad
