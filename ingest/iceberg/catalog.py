"""Opening an Iceberg catalog from the config's ``catalog:`` properties."""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.catalog import Catalog, load_catalog

from ingest.errors import CatalogUnavailable, ConfigError


def connect(properties: Mapping[str, str]) -> Catalog:
    props = dict(properties)
    name = props.pop("name")
    try:
        catalog = load_catalog(name, **props)
        if type(catalog).__module__ == "pyiceberg.catalog.sql":  # SqlCatalog: its module is loaded now
            from ingest.iceberg.held_catalog import HeldSqlCatalog

            catalog.engine.dispose()  # type: ignore[attr-defined]
            catalog = HeldSqlCatalog(catalog.name, **catalog.properties)
        return catalog
    except (ValueError, NotImplementedError) as error:
        raise ConfigError(f"catalog: {error}") from None
    except Exception as error:  # driver errors of every catalog backend
        raise CatalogUnavailable(f"cannot open Iceberg catalog {name!r}: {error}") from None
