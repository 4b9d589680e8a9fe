"""Small helpers shared by the servers tier's tests."""

from __future__ import annotations

import time

from include.servers.launcher import probe_models


def answers(url: str) -> bool:
    """Return whether anything answers HTTP at ``url`` (any status, even 401)."""
    return probe_models(url, None, 2.0).answering


def wait_answering(url: str, timeout: float = 60.0) -> bool:
    """Wait until ``url`` answers; return False if it did not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(url):
            return True
        time.sleep(0.1)
    return False
