"""Durations as people write them: ``300`` (seconds), ``250ms``, ``30s``, ``5m``, ``1h``, ``1d``."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> float:
    """``text`` in seconds; ValueError naming the forms it takes when it is none of them."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration; use e.g. 30s, 5m, 1h or 1d (a bare number is seconds)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]
