"""Waiting for a test server the tests started to answer, and stopping it."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path


def ready(process: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path) -> None:
    """Return once ``url`` answers and ``process`` is still alive a moment later (an answer from
    another server on the same port, while ours died binding it, does not count); raise
    :class:`TimeoutError` saying why otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TimeoutError(f"exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                pass
        except Exception:  # refused, reset, a half-started server's garbage: not yet
            time.sleep(0.2)
            continue
        time.sleep(0.5)
        if process.poll() is None:
            return
    raise TimeoutError(f"did not answer at {url} within {timeout_s:.0f} s; see {log}")


def stop(process: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """Terminate ``process`` if it still runs, and kill it if it outlives ``grace_s``."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
