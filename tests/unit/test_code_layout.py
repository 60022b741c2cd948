"""The shape of ``ingest/``: one concept per module keeps modules small, and no module reaches back
up to a module that imports it (the layers themselves are import-linter's, in ``make lint``)."""

from __future__ import annotations

from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[2] / "ingest"
#: past this, a module holds more than one concept: split it by concept before adding to it
MAX_LINES = 400


def test_no_module_of_ingest_is_over_400_lines() -> None:
    sizes = {path.relative_to(PACKAGE.parent): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {str(path): n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycle_in_ingest() -> None:
    graph = grimp.build_graph("ingest")
    cycles = {
        tuple(sorted((module, imported)))
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    }
    assert cycles == set()
