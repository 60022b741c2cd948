"""The commands that start a pipeline of your own: ``ingest init`` (a commented starter config and
the schema editors check it with) and ``ingest config-schema`` (that JSON Schema)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer

from ingest.cli.common import app, guarded, out
from ingest.errors import ConfigError

STARTER = "starter.yaml"
#: the schema's file beside a config: the starter's ``# yaml-language-server: $schema=`` line names it
SCHEMA_FILE = "ingest.schema.json"


def schema_text() -> str:
    from ingest.config.json_schema import config_schema

    return json.dumps(config_schema(), indent=2) + "\n"


@app.command("config-schema")
def config_schema(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write it to this file instead of stdout.")
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The configuration reference as Markdown instead.")
    ] = False,
) -> None:
    """Print the JSON Schema (draft 2020-12) of a pipeline config: every key with its type, default and
    description. Editors check and complete a config with it (the YAML language server reads a
    `# yaml-language-server: $schema=<file>` first line)."""
    if markdown:
        from ingest.config.reference import reference_markdown

        text = reference_markdown()
    else:
        text = schema_text()
    if output is None:
        print(text, end="")
        return
    guarded(False, lambda: _write(output, text))


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Where to write the pipeline (created if missing).")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite the files if they exist.")] = False,
) -> None:
    """Write a starter pipeline: DIRECTORY/pipeline.yaml (the orders example, commented, with the
    catalogs and registry formats to choose from), the schema editors check it with, and the
    directory of its local warehouse."""

    def body() -> None:
        config, schema = directory / "pipeline.yaml", directory / SCHEMA_FILE
        there = [str(path) for path in (config, schema) if path.exists()]
        if there and not force:
            raise ConfigError(
                f"{' and '.join(there)} exist(s); nothing was written. Choose another directory, or --force"
            )
        # the starter's catalog: SQLite and a warehouse in DIRECTORY/warehouse
        (directory / "warehouse").mkdir(parents=True, exist_ok=True)
        _write(config, (files("ingest.examples") / STARTER).read_text())
        _write(schema, schema_text())
        out.print(
            f"wrote {config} and {schema}\n"
            f"next: fill in your broker, catalog and topic (the comments say how), then\n"
            f"  ingest check -c {config}     # says what is missing, changing nothing\n"
            f"  ingest run -c {config} --until-caught-up",
            soft_wrap=True,
            highlight=False,
        )

    guarded(False, body)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror}") from None
