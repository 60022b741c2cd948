"""The formats table (ingest/format_names.py) and the decoders made under its names
(ingest/formats/decoders.py): a format added to one and not the other, or made otherwise than its
row says, is refused before anything runs."""

from __future__ import annotations

import dataclasses

import pytest

from ingest.format_names import FORMAT, FORMATS, REGISTRY_FORMATS, Format
from ingest.formats.decoders import DECODERS, disagreements, writer_fields
from ingest.ports import WriterSchema


def test_the_decoders_make_every_format_as_its_row_says() -> None:
    assert disagreements(FORMATS, DECODERS) == []


@pytest.mark.parametrize("name", REGISTRY_FORMATS)
def test_each_registry_format_is_decoded_by_the_class_of_its_own_row(name: str) -> None:
    # the classes are imported when first used, so the import-time check cannot see them
    load = DECODERS[name].registry
    assert load is not None
    assert load().format == FORMAT[name]


def test_a_format_without_decoders_or_decoders_without_a_format_is_named() -> None:
    extra = Format("csv", "CSV")

    assert disagreements([*FORMATS, extra], DECODERS) == ["csv: no decoders"]
    assert disagreements(FORMATS, {**DECODERS, "csv": DECODERS["json"]}) == ["csv: decoders of no format"]


def test_decoders_that_do_not_match_the_capabilities_of_their_row_are_named() -> None:
    rows = [dataclasses.replace(f, keys=True) if f.name == "json" else f for f in FORMATS]
    no_file = {**DECODERS, "avro": dataclasses.replace(DECODERS["avro"], file=None)}

    assert disagreements(rows, DECODERS) == ["json: its row says keys=True, its decoders False"]
    assert disagreements(FORMATS, no_file) == ["avro: its row says schema_file=True, its decoders False"]


def test_a_writer_schema_of_a_type_no_format_reads_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="schema id 4 is a THRIFT schema, which this version cannot read yet"):
        writer_fields(WriterSchema(4, "THRIFT", "{}"))
