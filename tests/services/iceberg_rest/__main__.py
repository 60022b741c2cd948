"""``python -m tests.services.iceberg_rest resolve``: fetch Iceberg's REST catalog server from Maven
Central into .cache/ (the tests do it on first use too)."""

from __future__ import annotations

import sys

from tests.services.iceberg_rest import RestUnavailable, resolve

if __name__ == "__main__":
    if sys.argv[1:] != ["resolve"]:
        sys.exit("usage: python -m tests.services.iceberg_rest resolve")
    try:
        print(resolve())
    except RestUnavailable as error:
        sys.exit(f"Iceberg's REST catalog server is not available: {error}")
