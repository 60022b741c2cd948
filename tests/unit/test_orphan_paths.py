"""Which stored files orphan removal may delete: paths compared as the stores name them."""

from __future__ import annotations

import pytest

from ingest.errors import TableMismatch
from ingest.iceberg.files import path_key, unreferenced


def test_one_object_under_the_s3_schemes_and_one_local_file_however_spelled() -> None:
    assert path_key("s3a://lake/wh/t/data/a.parquet") == path_key("s3://lake/wh/t/data/a.parquet")
    assert path_key("file:/wh/t/a.parquet") == path_key("file:///wh/t/a.parquet") == path_key("/wh/t/a.parquet")
    assert path_key("s3://lake/wh/a.parquet") != path_key("s3://other/wh/a.parquet")


def test_only_files_no_snapshot_names_are_orphans() -> None:
    stored = ["s3://lake/wh/t/data/a.parquet", "s3://lake/wh/t/data/b.parquet"]
    assert unreferenced(stored, ["s3a://lake/wh/t/data/a.parquet"]) == ["s3://lake/wh/t/data/b.parquet"]
    assert unreferenced(["file:///wh/t/data/a.parquet"], ["file:/wh/t/data/a.parquet"]) == []


def test_a_live_file_under_another_authority_stops_the_removal() -> None:
    with pytest.raises(TableMismatch, match="Nothing was deleted"):
        unreferenced(["s3://lake/wh/t/data/a.parquet"], ["s3://mirror/wh/t/data/a.parquet"])
