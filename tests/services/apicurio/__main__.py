"""``python -m tests.services.apicurio run -- COMMAND…``: run COMMAND with Apicurio Registry up
(``SCHEMA_REGISTRY_URL`` set to its Confluent-compatible API), then stop it; where the registry
cannot run, say why and run COMMAND without it. ``resolve`` only fetches it from Maven Central."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.services.apicurio import Apicurio, RegistryUnavailable, resolve

USAGE = "usage: python -m tests.services.apicurio resolve | run -- COMMAND..."


def main(argv: list[str]) -> int:
    if argv == ["resolve"]:
        try:
            print(resolve())
        except RegistryUnavailable as error:
            sys.exit(f"Apicurio Registry is not available: {error}")
        return 0
    if len(argv) < 3 or argv[:2] != ["run", "--"]:
        sys.exit(USAGE)
    command = argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            registry = Apicurio(Path(tmp)).start()
        except RegistryUnavailable as error:
            print(f"Apicurio Registry cannot run here, so no Schema Registry: {error}", file=sys.stderr)
            return subprocess.call(command)
        try:
            return subprocess.call(command, env={**os.environ, "SCHEMA_REGISTRY_URL": registry.url})
        finally:
            registry.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
