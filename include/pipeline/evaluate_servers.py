"""``evaluate_drafter``'s servers: launch every pass, the health gate's targets, teardown.

The same launcher, gate and teardown as the main DAG's (``include.servers``): each drafter
configuration (and the target alone) gets its own share of the deployment's servers
(``include.evaluation.passes``), launched with that pass's speculative flags, the draft path
taken from the deployment's ``allowed_drafters``. The plan is rebuilt from the run's params in
every task; XCom carries the launch reports' server identifiers only, matched against the
deployment's own servers as the main DAG's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from include.servers.sensor import ServerHealthSensor

if TYPE_CHECKING:
    from include.settings import RunSettings


def launch(checked: list[dict[str, Any]], params: Mapping[str, Any] | None, dag_id: str,
           run_id: str | None) -> dict[str, Any]:
    """The launch_servers task: one launch per pass; ``{"passes": {config: report}}``.

    A pass that cannot launch releases what the earlier passes of this task started before
    the task fails (the teardown runs only after a setup that succeeded).
    """
    from include.evaluation.binding import bind_evaluation
    from include.pipeline.binding import lease_owner
    from include.servers.launcher import launch_servers, stop_servers

    _, settings, passes = bind_evaluation(params)
    owner = lease_owner(dag_id, run_id)
    reports: dict[str, Any] = {}
    try:
        for p in passes:
            report = launch_servers(settings, owner=owner, speculative=p.speculative,
                                    servers=p.servers)
            flags = " ".join(p.speculative.flags()) if p.speculative else "the target alone"
            print(f"{p.config}: {flags}\n{report.summary()}")
            reports[p.config] = report
    except BaseException:
        for report in reports.values():
            stop_servers(report, settings, owner=owner, check=False)
        raise
    return {"passes": {c: r.to_dict() for c, r in reports.items()}}


def targets(launched: dict[str, Any], params: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The health_targets task: fail on servers that cannot serve their pass; their idents."""
    from include.evaluation.binding import bind_evaluation
    from include.pipeline.binding import fail_without_retry
    from include.servers.launch_report import LaunchReport, XComMismatchError

    _, settings, _ = bind_evaluation(params)
    out: list[dict[str, Any]] = []
    with fail_without_retry(XComMismatchError):
        for report in _reports(launched):
            loaded = LaunchReport.from_dict(report, settings)
            loaded.raise_for_problems()
            out += loaded.health_targets()
    return out


def stop(launched: dict[str, Any], params: Mapping[str, Any] | None, dag_id: str,
         run_id: str | None) -> None:
    """The stop_servers task (teardown): stop every pass's servers this run started."""
    from include.evaluation.binding import bind_evaluation
    from include.pipeline.binding import fail_without_retry, lease_owner
    from include.servers.launch_report import XComMismatchError
    from include.servers.launcher import stop_servers

    _, settings, _ = bind_evaluation(params)
    with fail_without_retry(XComMismatchError):
        for report in _reports(launched):
            print(stop_servers(report, settings, owner=lease_owner(dag_id, run_id)).summary())


def _reports(launched: Any) -> list[dict[str, Any]]:
    from include.servers.launch_report import XComMismatchError

    passes = launched.get("passes") if isinstance(launched, dict) else None
    if not isinstance(passes, dict):
        raise XComMismatchError("the launch report in XCom is not {'passes': {...}}")
    return list(passes.values())


class EvaluationHealthSensor(ServerHealthSensor):
    """The main DAG's health gate, with the evaluation's settings: its form is not a run's.

    The servers' settings are rebuilt from the evaluation's params (``server_settings``);
    everything else (the deployment's own server for the identifier, the model and context
    length it must report, the launch timeout, the key's connection) is the gate's own.
    """

    def _settings(self, context: Any) -> RunSettings:
        from include.evaluation.binding import bind_evaluation

        params = context.get("params") if hasattr(context, "get") else None
        return bind_evaluation(params)[1]
