"""A config of several tables (``tables:``): each entry is a pipeline of its own table, with its
own ledger; a topic moves from one entry to another only by a ``reset`` naming the table."""

from __future__ import annotations

from collections.abc import Callable

from ingest.committer import observe
from ingest.config import PipelineConfig
from ingest.errors import TopicIdChanged, TopicMoved
from ingest.ports import LedgerTable


def for_table(config: PipelineConfig, error: TopicIdChanged) -> TopicIdChanged:
    """``error`` with a reset command that names ``--table`` where the config has several tables."""
    return error.on_table(config.table) if config.siblings else error


def not_read_elsewhere(config: PipelineConfig, existing: Callable[[str], LedgerTable | None], new: set[str]) -> None:
    """Fail closed when a topic new to this table's ledger is in the ledger of another table of
    the config (``tables:``; ``existing`` opens another entry's rows table, if it exists): it moved
    here (another entry listed it, a pattern changed), and reading it from the start would store
    what the other table holds twice."""
    if not new or not config.siblings:
        return
    for sibling in config.siblings:
        table = existing(sibling)
        found = observe(table, config.pipeline) if table is not None else None
        if found is None or not new & found.ledger.topics:
            continue
        moved = sorted(new & found.ledger.topics)
        where = ",".join(
            f"{tp.topic}:{tp.partition}={end}" for tp, end in sorted(found.ledger.offsets.items()) if tp.topic in moved
        )
        raise TopicMoved(
            f"topic(s) {', '.join(moved)} now feed {config.table}, but {sibling} has read them (its ledger "
            f"ends at {where}): reading them here from the start would store those records twice. To go on "
            f"where {sibling} stopped: ingest reset -c CONFIG --table {config.table} --to-offsets {where} "
            "--reason moved; to store them twice on purpose, give their earliest offsets the same way."
        )
