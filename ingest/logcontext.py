"""What a log line is about: the pipeline and the batch, as fields of every record.

``about(pipeline=..., batch=...)`` sets them for the code it wraps (a context variable: nested
calls see them, other threads and the worker processes do not); :class:`Fields` copies them onto
each log record, where ``--log-format json`` shows them as keys of the line's object (a record's
own ``extra`` wins, e.g. the ``snapshot_id`` of a committed batch's line).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

_fields: ContextVar[Mapping[str, object]] = ContextVar("ingest_log_fields", default=MappingProxyType({}))


@contextmanager
def about(**fields: object) -> Iterator[None]:
    """Log records made inside carry ``fields`` (added to those set further out)."""
    token = _fields.set({**_fields.get(), **fields})
    try:
        yield
    finally:
        _fields.reset(token)


class Fields(logging.Filter):
    """A handler filter that puts the fields of :func:`about` on each record it handles."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _fields.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
