"""Log records carry what they are about (:mod:`ingest.logcontext`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from ingest.logcontext import Fields, about


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(Fields())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    logger = logging.getLogger("test.logcontext")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


def test_fields_nest_and_end_with_their_block(kept: Kept) -> None:
    log = logging.getLogger("test.logcontext")
    with about(pipeline="orders"):
        with about(batch=7):
            log.info("inside")
            log.info("its own batch", extra={"batch": 8})
        log.info("after the batch")
    log.info("outside")

    seen = [(r.getMessage(), getattr(r, "pipeline", None), getattr(r, "batch", None)) for r in kept.records]
    assert seen == [
        ("inside", "orders", 7),
        ("its own batch", "orders", 8),
        ("after the batch", "orders", None),
        ("outside", None, None),
    ]


def test_another_thread_does_not_see_them(kept: Kept) -> None:
    log = logging.getLogger("test.logcontext")
    with about(pipeline="orders"):
        thread = threading.Thread(target=log.info, args=("elsewhere",))
        thread.start()
        thread.join()
    assert getattr(kept.records[0], "pipeline", None) is None
