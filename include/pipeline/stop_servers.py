"""``stop_servers``: stop exactly the servers this run started, whatever happened to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from include.pipeline.binding import bind, fail_without_retry, lease_owner


def run(report: dict[str, Any], params: Mapping[str, Any] | None, dag_id: str,
        run_id: str | None) -> None:
    """The stop_servers task: stop and confirm gone, releasing this run's lease (on the
    deployment's own servers only: ``include.servers.launch_report``)."""
    from include.servers.launch_report import XComMismatchError
    from include.servers.launcher import stop_servers

    with fail_without_retry(XComMismatchError):
        stopped = stop_servers(report, bind(params), owner=lease_owner(dag_id, run_id))
    print(stopped.summary())
