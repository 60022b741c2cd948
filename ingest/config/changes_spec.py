"""``changes:``: the topics are changelogs, whose records change the rows of their keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from ingest.config.sections import Strict
from ingest.records import OWN_COLUMNS


class ChangesSpec(Strict):
    """Each record changes the row of its key (an upsert or a delete) instead of adding a row: the
    table holds, for every key, the row of its newest committed change, or none if that deleted it."""

    envelope: Literal["debezium", "upsert"]
    """``debezium``: each value is a Debezium change event (``op`` ``c``, ``r`` and ``u`` upsert its ``after`` image,
    ``d`` deletes its ``before`` image's key; the tombstone after a delete is skipped; ``t`` and unknown ops are dead
    letters); ``upsert``: each value is its key's whole row, and a tombstone (a null value) deletes the row its Kafka
    key names (decoded with ``key_format``)
    """
    key: Annotated[list[str], Field(min_length=1)]
    """the row identity: one or more top-level columns (the table's identifier fields); a change whose key column is
    null is a dead letter
    """

    @field_validator("key")
    @classmethod
    def _plain_columns(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a column is named twice: {value}")
        for name in value:
            if name in OWN_COLUMNS:
                raise ValueError(
                    f"{name!r} is a column the pipeline adds itself; a key is made of the rows' own columns"
                )
        return value
