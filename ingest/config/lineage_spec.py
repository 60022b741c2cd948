"""``lineage:``: where a run's OpenLineage events go, when not the standard environment's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import model_validator

from ingest.config.sections import Strict


class LineageSpec(Strict):
    """OpenLineage run events of the runs (``lineage:``); without it, ``OPENLINEAGE_URL``, ``openlineage.yml``
    or ``OPENLINEAGE__*`` say where, and with none of them no event is sent."""

    url: str | None = None
    """an OpenLineage HTTP endpoint's base URL (Marquez's ``http://marquez:5000``), as ``OPENLINEAGE_URL``"""
    endpoint: str = "api/v1/lineage"
    """the path under ``url`` events are posted to"""
    api_key: str | None = None
    """a bearer token for ``url`` (``${ENV}`` keeps it out of the file)"""
    transport: dict[str, Any] | None = None
    """instead of ``url``: an openlineage-python transport as ``openlineage.yml`` writes it (``type: kafka``, ...)"""
    namespace: str | None = None
    """the jobs' namespace; default: ``OPENLINEAGE_NAMESPACE``, else ``default``"""
    timeout_s: float = 5.0
    """how long ``url`` may take to take an event; a backend that is down never fails a run"""

    @model_validator(mode="after")
    def _one_destination(self) -> LineageSpec:
        if (self.url is None) == (self.transport is None):
            raise ValueError("give `url` (an HTTP endpoint) or `transport` (any openlineage-python transport), one")
        return self


def configured(spec: LineageSpec | None) -> bool:
    """Whether a run's events go anywhere: the ``lineage:`` block, or openlineage-python's standard
    configuration (``OPENLINEAGE_URL``, ``OPENLINEAGE_CONFIG``, ``openlineage.yml`` in the working
    directory or ``~/.openlineage/``, ``OPENLINEAGE__TRANSPORT__*``), unless ``OPENLINEAGE_DISABLED``.
    Told without importing the client (~0.2 s): a run with no destination never does."""
    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if spec is not None or os.environ.get("OPENLINEAGE_URL"):
        return True
    files = [os.environ.get("OPENLINEAGE_CONFIG"), "openlineage.yml", "~/.openlineage/openlineage.yml"]
    if any(path and Path(path).expanduser().is_file() for path in files):
        return True
    return any(key.startswith("OPENLINEAGE__TRANSPORT") for key in os.environ)
