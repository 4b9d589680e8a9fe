"""``launch_servers``: start (or reuse) one server per GPU, only if a shard is left to run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import bind, lease_owner


def run(plan: list[dict[str, Any]], params: Mapping[str, Any] | None, dag_id: str,
        run_id: str | None) -> dict[str, Any]:
    """The launch_servers task: launch for the plan under this run's lease
    (``binding.lease_owner``), log what was done, return the report."""
    from include.servers.launcher import launch_for_plan

    report = launch_for_plan(bind(params), plan, owner=lease_owner(dag_id, run_id))
    print(report.summary())
    return report.to_dict()
