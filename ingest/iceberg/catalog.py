"""Opening an Iceberg catalog from the config's ``catalog:`` properties."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog, CatalogType, load_catalog
from pyiceberg.exceptions import NotInstalledError

from ingest.errors import CatalogUnavailable, ConfigError
from ingest.iceberg import sharing


def absent(properties: Mapping[str, str]) -> Path | None:
    """The file of a SQLite catalog that does not exist yet (opening it would create it); None for
    any other catalog."""
    uri = str(properties.get("uri", ""))
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    path = Path(uri.removeprefix("sqlite:///").split("?")[0])
    # a missing directory is a mistake, not a catalog to come: opening it says so (78)
    return path if path.parent.is_dir() and not path.exists() else None


def check_type(properties: Mapping[str, str]) -> None:
    """Refuse a ``type`` pyiceberg does not know, listing the ones it does (a class of your own
    goes in ``py-catalog-impl``)."""
    kind = properties.get("type")
    known = [t.value for t in CatalogType]
    if kind is not None and kind.lower() not in known:
        raise ConfigError(
            f"catalog.type: {kind!r} is not a catalog type pyiceberg knows; one of: {', '.join(known)} (or leave it "
            "out and give `py-catalog-impl`, a class of your own). Fix `catalog:` in the config."
        )


def connect(properties: Mapping[str, str], request_timeout_s: float = 60.0) -> Catalog:
    """The catalog ``properties`` name; a REST catalog's requests give up after
    ``request_timeout_s`` (``commit.request_timeout_s``)."""
    opened = sharing.opened()
    if opened is None:
        return _connect(properties, request_timeout_s)
    key = (*sorted(properties.items()), ("request_timeout_s", str(request_timeout_s)))
    if key not in opened:
        opened[key] = _connect(properties, request_timeout_s)
    catalog: Catalog = opened[key]
    return catalog


def _connect(properties: Mapping[str, str], request_timeout_s: float) -> Catalog:
    check_type(properties)
    props = dict(properties)
    name = props.pop("name")
    if _is_rest(props):  # other catalogs never load the REST client's module (~0.1 s of imports)
        _bound_rest_requests(request_timeout_s)
    try:
        catalog = load_catalog(name, **props)
        if type(catalog).__module__ == "pyiceberg.catalog.sql":  # SqlCatalog: its module is loaded now
            from ingest.iceberg.held_catalog import HeldSqlCatalog

            catalog.engine.dispose()  # type: ignore[attr-defined]
            catalog = HeldSqlCatalog(catalog.name, **catalog.properties)
        return catalog
    except (ValueError, NotImplementedError, NotInstalledError, ImportError) as error:
        if type(error).__name__ == "ValidationError":  # pydantic's: an answer that is no REST response
            raise CatalogUnavailable(
                f"cannot open Iceberg catalog {name!r}: its answer is not an Iceberg REST response "
                f"(a proxy's error page?): {str(error).splitlines()[0]}"
            ) from None
        raise ConfigError(f"catalog: {error}") from None
    except Exception as error:  # driver errors of every catalog backend
        mistake = _mistake(props, str(error))
        if mistake is not None:
            raise ConfigError(
                f"catalog.uri: {mistake}. Fix `catalog:` in the config; retrying will not help."
            ) from None
        raise CatalogUnavailable(f"cannot open Iceberg catalog {name!r}: {error}") from None


def _is_rest(props: Mapping[str, str]) -> bool:
    """Whether pyiceberg opens ``props`` as a REST catalog (named, or inferred from an HTTP URI)."""
    kind = props.get("type")
    return kind == "rest" or (kind is None and str(props.get("uri", "")).startswith(("http://", "https://")))


def _bound_rest_requests(seconds: float) -> None:
    """Give every request of pyiceberg's REST client a timeout of ``seconds``: it sets none, so a
    catalog that never answers would hold a run for ever, where an unanswered commit should be an
    unknown outcome to settle and an unanswered load a retryable failure. Each session the client
    makes (the config request when it opens, its legacy OAuth2 token requests, every call after)
    is a ``pyiceberg.catalog.rest.Session``: that name becomes a subclass whose requests default to
    ``seconds`` (requests' own way to set one). The token request of ``auth.type: oauth2`` calls
    ``requests.post`` directly and stays unbounded."""
    from pyiceberg.catalog import rest

    session: Any = getattr(rest, "Session")  # noqa: B009  (not in its __all__)
    base: Any = getattr(session, "untimed", session)

    class TimedSession(base):  # type: ignore[misc, valid-type]
        untimed = base

        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", seconds)
            return super().request(method, url, *args, **kwargs)

    setattr(rest, "Session", TimedSession)  # noqa: B010


#: what a PostgreSQL server says when the configuration, not the moment, is wrong
_REFUSALS = ("does not exist", "password authentication failed", "no pg_hba.conf entry", "permission denied")


def _mistake(props: Mapping[str, str], message: str) -> str | None:
    """The configuration mistake a catalog's driver error shows, if it shows one (a missing SQLite
    directory, a database or role the server does not have, credentials it refuses); None if the
    error may heal by itself (a server down or unreachable)."""
    uri = str(props.get("uri", ""))
    first = message.splitlines()[0] if message else ""
    if "Can't load plugin: sqlalchemy.dialects:" in first:
        scheme = uri.split(":", 1)[0]
        return (
            f"{scheme!r} is not a database SQLAlchemy knows ({first}); a SQL catalog's uri starts with "
            "sqlite:/// or postgresql+psycopg://"
        )
    if uri.startswith("sqlite:"):
        path = Path(uri.removeprefix("sqlite:///").split("?")[0])
        if "unable to open database file" in message:
            if not path.parent.is_dir():
                return f"the directory {path.parent} of the SQLite catalog does not exist (create it, or fix the path)"
            return f"SQLite cannot open {path} (check its permissions)"
        if "file is not a database" in first:
            return f"{path} is not a SQLite database (point the uri at the catalog's database file, or at a new path)"
    if "FATAL:" in first and any(refusal in first for refusal in _REFUSALS):
        return "the PostgreSQL server refused: " + first.split("FATAL:", 1)[1].strip()
    if "no password supplied" in first:
        return "the PostgreSQL server wants a password and the URI has none (user:${PGPASSWORD}@host)"
    return None
