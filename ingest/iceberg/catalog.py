"""Opening an Iceberg catalog from the config's ``catalog:`` properties."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NotInstalledError

from ingest.errors import CatalogUnavailable, ConfigError


def absent(properties: Mapping[str, str]) -> Path | None:
    """The file of a SQLite catalog that does not exist yet (opening it would create it); None for
    any other catalog."""
    uri = str(properties.get("uri", ""))
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    path = Path(uri.removeprefix("sqlite:///").split("?")[0])
    # a missing directory is a mistake, not a catalog to come: opening it says so (78)
    return path if path.parent.is_dir() and not path.exists() else None


def connect(properties: Mapping[str, str], request_timeout_s: float = 60.0) -> Catalog:
    """The catalog ``properties`` name; a REST catalog's requests give up after
    ``request_timeout_s`` (``commit.request_timeout_s``)."""
    props = dict(properties)
    name = props.pop("name")
    try:
        catalog = load_catalog(name, **props)
        if type(catalog).__module__ == "pyiceberg.catalog.sql":  # SqlCatalog: its module is loaded now
            from ingest.iceberg.held_catalog import HeldSqlCatalog

            catalog.engine.dispose()  # type: ignore[attr-defined]
            catalog = HeldSqlCatalog(catalog.name, **catalog.properties)
        session = getattr(catalog, "_session", None)  # RestCatalog's requests.Session
        if session is not None:
            _time_out(session, request_timeout_s)
        return catalog
    except (ValueError, NotImplementedError, NotInstalledError, ImportError) as error:
        raise ConfigError(f"catalog: {error}") from None
    except Exception as error:  # driver errors of every catalog backend
        mistake = _mistake(props, str(error))
        if mistake is not None:
            raise ConfigError(
                f"catalog.uri: {mistake}. Fix `catalog:` in the config; retrying will not help."
            ) from None
        raise CatalogUnavailable(f"cannot open Iceberg catalog {name!r}: {error}") from None


def _time_out(session: Any, seconds: float) -> None:
    """Give every request of ``session`` a timeout: pyiceberg's REST client sets none, so a
    catalog that never answers a commit would hold the batch for ever instead of leaving an unknown
    outcome to settle (requests' way: a default for ``Session.request``)."""
    request = session.request

    def timed(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", seconds)
        return request(method, url, **kwargs)

    session.request = timed


#: what a PostgreSQL server says when the configuration, not the moment, is wrong
_REFUSALS = ("does not exist", "password authentication failed", "no pg_hba.conf entry", "permission denied")


def _mistake(props: Mapping[str, str], message: str) -> str | None:
    """The configuration mistake a catalog's driver error shows, if it shows one (a missing SQLite
    directory, a database or role the server does not have, credentials it refuses); None if the
    error may heal by itself (a server down or unreachable)."""
    uri = str(props.get("uri", ""))
    if uri.startswith("sqlite:") and "unable to open database file" in message:
        path = Path(uri.removeprefix("sqlite:///").split("?")[0])
        if not path.parent.is_dir():
            return f"the directory {path.parent} of the SQLite catalog does not exist (create it, or fix the path)"
        return f"SQLite cannot open {path} (check its permissions)"
    first = message.splitlines()[0] if message else ""
    if "FATAL:" in first and any(refusal in first for refusal in _REFUSALS):
        return "the PostgreSQL server refused: " + first.split("FATAL:", 1)[1].strip()
    if "no password supplied" in first:
        return "the PostgreSQL server wants a password and the URI has none (user:${PGPASSWORD}@host)"
    return None
