"""``ingest config-schema`` and ``ingest init``: the JSON Schema of a pipeline config, derived from
the config model, checks the shipped examples and catches what the loader refuses; the committed
schema file is the command's output; a starter pipeline loads as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from ingest.cli import app
from ingest.cli.starting import SCHEMA_FILE, schema_text
from ingest.config import load_routes
from ingest.config.json_schema import config_schema
from ingest.config.keys import PipelineKeys
from ingest.errors import ExitCode

CONF = Path(__file__).resolve().parents[2] / "conf"
EXAMPLES = sorted(CONF.glob("*.yaml"))


def validator() -> jsonschema.Draft202012Validator:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(document: Any) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(document))


def test_the_committed_schema_is_what_the_command_prints() -> None:
    assert (CONF / SCHEMA_FILE).read_text() == schema_text(), "run `ingest config-schema -o conf/ingest.schema.json`"


def test_the_reference_page_is_what_the_command_prints_and_names_every_key() -> None:
    page = (CONF.parent / "docs" / "configuration.md").read_text()
    result = CliRunner().invoke(app, ["config-schema", "--markdown"])

    assert result.stdout == page, "run `ingest config-schema --markdown -o docs/configuration.md`"
    schema = config_schema()
    keys = [*schema["properties"], *(k for d in schema["$defs"].values() for k in d.get("properties", {}))]
    assert [k for k in keys if f"| `{k}` |" not in page] == []


def test_every_key_of_the_model_is_described() -> None:
    schema = config_schema()
    undescribed = [
        f"{where}.{name}"
        for where, properties in [("", schema["properties"])]
        + [(name, d.get("properties", {})) for name, d in schema["$defs"].items()]
        for name, prop in properties.items()
        if not prop.get("description")
    ]
    assert undescribed == []
    assert set(schema["properties"]) == {f.alias or name for name, f in PipelineKeys.model_fields.items()} | {"tables"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_each_example_config_names_the_schema_and_passes_it(example: Path) -> None:
    assert example.read_text().startswith(f"# yaml-language-server: $schema={SCHEMA_FILE}\n")
    assert problems(yaml.safe_load(example.read_text())) == []


def test_the_schema_catches_a_misspelled_key_a_wrong_type_and_a_bad_enum() -> None:
    config = yaml.safe_load((CONF / "orders.yaml").read_text())
    config["partiton_by"] = config.pop("partition_by")
    config["batch"]["max_records"] = "many"
    config["on_data_loss"] = "ignore"

    found = problems(config)

    assert any("'partiton_by' was unexpected" in p for p in found)
    assert any(p.startswith("batch/max_records") for p in found)
    assert any(p.startswith("on_data_loss") for p in found)


def test_the_schema_takes_an_environment_variable_where_a_number_goes() -> None:
    config = yaml.safe_load((CONF / "orders.yaml").read_text())
    config["batch"]["max_records"] = "${MAX_RECORDS:-1000}"

    assert problems(config) == []


def test_a_config_of_several_tables_needs_a_table_in_each_entry() -> None:
    config = yaml.safe_load((CONF / "shop_tables.yaml").read_text())
    del config["tables"][0]["table"]
    config["tables"][1]["batch"] = {"max_records": 5}  # a key of the pipeline, not of a table

    found = problems(config)

    assert any(p.startswith("tables/0") and "'table' is a required property" in p for p in found)
    assert any(p.startswith("tables/1") and "'batch' was unexpected" in p for p in found)


def test_config_schema_prints_the_schema() -> None:
    result = CliRunner().invoke(app, ["config-schema"])

    assert result.exit_code == 0
    assert json.loads(result.stdout)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_init_writes_a_starter_that_loads_as_written_and_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    runner = CliRunner()

    first = runner.invoke(app, ["init", str(target)])

    assert first.exit_code == 0, first.output
    assert "ingest check -c" in first.stdout
    routes = load_routes(target / "pipeline.yaml", env={})
    assert [r.table for r in routes] == ["analytics.orders"]
    assert routes[0].catalog["uri"] == f"sqlite:///{target / 'warehouse' / 'catalog.db'}"
    assert (target / "warehouse").is_dir()
    assert problems(yaml.safe_load((target / "pipeline.yaml").read_text())) == []
    assert (target / SCHEMA_FILE).read_text() == schema_text()

    again = runner.invoke(app, ["init", str(target)])
    assert again.exit_code == ExitCode.CONFIG and "nothing was written" in again.output
    assert runner.invoke(app, ["init", str(target), "--force"]).exit_code == 0
