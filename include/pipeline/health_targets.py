"""``health_targets``: the servers the health gate waits for, read back through the settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import bind, fail_without_retry


def run(report: dict[str, Any], params: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The health_targets task: fail on servers that cannot serve this run; return each
    server's identifier (an edited launch report fails without a retry)."""
    from include.servers.launch_report import LaunchReport, XComMismatchError

    with fail_without_retry(XComMismatchError):
        launched = LaunchReport.from_dict(report, bind(params))
    launched.raise_for_problems()
    return launched.health_targets()
