"""``preflight``: one real request per server, the run's longest first request, before any
shard (a whole conversation's first turn, as the engine sends it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import bind, fail_without_retry, open_run_store


def run(report: dict[str, Any], plan: list[dict[str, Any]],
        params: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The preflight task: send the first planned shard's longest first request to every server;
    return the servers' identifiers (nothing is sent when no shard is left)."""
    from include.prompts import read_shard_by_id
    from include.servers.first_requests import preflight_run
    from include.servers.launch_report import LaunchReport, XComMismatchError

    settings = bind(params)
    with fail_without_retry(XComMismatchError):
        launched = LaunchReport.from_dict(report, settings)
    if plan:
        prompts = read_shard_by_id(open_run_store(settings), plan[0]["shard_id"])
        print(preflight_run(settings, launched.urls, prompts))
    return launched.idents
