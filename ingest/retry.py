"""The one retry loop: bounded attempts at a step that settles a commit by observing again.

Every commit in lakehouse-ingest is a compare-and-swap. When one is refused
(:class:`~ingest.errors.CommitConflict`) or its outcome is open (:class:`~ingest.errors.CommitUnknown`),
the step runs again from its start, which observes the table and decides afresh; it never repeats
the commit blindly. A step may also ask to run again with :class:`Again` (it observed that it
must catch up first, say).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from ingest.errors import CommitConflict, CommitUnknown, IngestError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Again(Exception):
    """Raised by a step that must observe again before it can finish."""


#: what makes a step run again (anything else propagates at once)
SETTLED_BY_OBSERVING = (CommitConflict, CommitUnknown, Again)

#: the attempts in this process that had to observe again, by why: ``conflict`` (another writer
#: committed first) or ``unknown`` (the outcome was open: a timeout, a lost acknowledgement)
RETRIED: collections.Counter[str] = collections.Counter()

_backoff = True


@contextlib.contextmanager
def without_backoff() -> Iterator[None]:
    """Run again at once instead of backing off (for tests that make thousands of attempts)."""
    global _backoff
    _backoff = False
    try:
        yield
    finally:
        _backoff = True


def _sleep(seconds: float) -> None:
    if _backoff:
        time.sleep(seconds)


def with_retries(step: Callable[[int], T], attempts: int, gave_up: Callable[[], IngestError], what: str) -> T:
    """``step(n)`` for ``n = 1, 2, …`` until it returns, at most ``attempts`` times, with a short
    jittered exponential backoff in between; ``gave_up()`` is raised after the last attempt.

    The step must begin by observing (that is what makes running it again safe). ``what`` names
    the operation in the log."""

    def note(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        RETRIED["conflict" if isinstance(error, CommitConflict | Again) else "unknown"] += 1
        level = logging.WARNING if isinstance(error, CommitUnknown) else logging.INFO
        log.log(level, "%s must observe again (attempt %d of %d): %s", what, state.attempt_number, attempts, error)

    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
        retry=retry_if_exception_type(SETTLED_BY_OBSERVING),
        before_sleep=note,
        sleep=_sleep,
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                return step(attempt.retry_state.attempt_number)
    except SETTLED_BY_OBSERVING as error:
        raise gave_up() from error
    raise AssertionError("tenacity ended without an outcome")  # pragma: no cover
