"""Catalogs opened once for a run of several tables (``tables:``), without importing pyiceberg:
the run enters :func:`shared` before its first table, whose workers start while pyiceberg is
imported (see :mod:`ingest.runner`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the catalogs opened inside :func:`shared`, by their properties; None outside it
_opened: dict[tuple[tuple[str, str], ...], Any] | None = None


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Inside the block, :func:`ingest.iceberg.catalog.connect` opens each catalog once: a run of
    several tables opens its catalog once, not twice per table."""
    global _opened
    outer, _opened = _opened, {} if _opened is None else _opened
    try:
        yield
    finally:
        _opened = outer


def opened() -> dict[tuple[tuple[str, str], ...], Any] | None:
    """The catalogs opened so far inside :func:`shared`; None outside it."""
    return _opened
