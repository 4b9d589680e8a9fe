"""Start, reuse, replace and stop the SGLang servers of a run, over SSH or on this machine.

``launch_servers(settings, owner=...)`` is idempotent: a server already answering
``/v1/models`` with the run's model name and context length is reused; one answering with other
settings is reported (and replaced only with ``replace_mismatched_servers``, and never while
another run leases it); a closed port with a live server process behind it is a server loading
its model (SGLang opens its port only then), used as it is, without waiting here: the health
gate waits for it and checks it; a silent port without a process gets a new server. Every
server the run uses gets the run's lease on its host. The ``LaunchReport`` it returns is JSON
data for XCom; ``stop_servers(report, settings)`` releases the run's leases and stops a server
only when no other run still leases it, so one run's teardown never stops servers another run
generates on. Teardown runs commands on the deployment's own servers only: each server of the
report is matched against the settings' (``trusted_spec``), never taken from XCom.

The servers' API key (``RunSettings.api_key``, the password of the ``sglang_conn_id`` connection)
reaches a server in its ``--config`` file, written from the SSH command's stdin; it is in no
command line, no report and no log tail this module returns.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from include.servers.commands import (
    ServerSpec,
    build_launch_command,
    parse_fields,
    server_config_yaml,
    server_specs,
)
from include.servers.decisions import (
    ModelsProbe,
    ServerProcess,
    launch_step,
    loading_outcome,
    refused_outcome,
    replace_blocked,
    reused_outcome,
    run_holds,
    started_outcome,
    stop_verdict,
    stopped_meanwhile,
)
from include.servers.expectations import ModelExpectation, SpeculativeLaunch, key_problems
from include.servers.hosts import HostError, Runners, fetch_log_tail, run_on_host
from include.servers.launch_report import (
    Action,
    LaunchReport,
    ServerOutcome,
    StopError,
    StopReport,
    trusted_spec,
)
from include.servers.lifecycle import (
    LOCK_WAIT_S,
    build_acquire_command,
    build_detached_command,
    build_release_command,
    build_status_command,
)
from include.sglang import sync as sglang
from include.sglang.contract import SERVER_INFO

if TYPE_CHECKING:
    from include.settings import RunSettings

log = logging.getLogger(__name__)


def read_process(runners: Runners, spec: ServerSpec) -> ServerProcess:
    """Read the server's process record on its host: pid, alive, owner, leases."""
    return ServerProcess.parse(run_on_host(runners, spec, build_status_command(spec.paths)).stdout)


def probe_models(url: str, api_key: str | None, timeout: float = 5.0) -> ModelsProbe:
    """GET ``url``/v1/models once; a refused or timed-out connection is ``answering=False``."""
    answer = sglang.models(url, api_key, timeout)
    if not answer.answered:
        return ModelsProbe(False, error=str(answer.error))
    if answer.error is not None:  # an HTTP error status (urllib's HTTPError)
        return ModelsProbe(True, answer.status, None, answer.body[:300].decode(errors="replace"))
    try:
        return ModelsProbe(True, answer.status, answer.json())
    except ValueError:
        return ModelsProbe(True, answer.status, None, f"not JSON: {answer.body[:200]!r}")


def probe_server_info(url: str, api_key: str | None, timeout: float = 5.0) -> Any:
    """GET ``url``/server_info once: its JSON, or None when it does not answer 200 with JSON."""
    answer = sglang.get(url, SERVER_INFO, api_key=api_key, timeout=timeout)
    if not answer.answered or answer.status != 200:
        return None
    try:
        return answer.json()
    except ValueError:
        return None


def launch_for_plan(settings: RunSettings, plan: list[dict[str, Any]], *,
                    owner: str | None = None) -> LaunchReport:
    """Launch the servers only when ``plan`` (from prepare_prompts) has a shard left to run.

    A backfill whose selected shards are all complete needs no GPU: it gets an empty report,
    so the health gate, preflight and shards are skipped and teardown has nothing to stop.
    """
    if not plan:
        log.info("every selected shard is already complete: no server launched")
        return LaunchReport([], ModelExpectation.from_settings(settings),
                            settings.launch_timeout_s, owner, settings.deployment.sglang_conn_id)
    return launch_servers(settings, owner=owner)


def launch_servers(
    settings: RunSettings,
    *,
    owner: str | None = None,
    runners: Runners | None = None,
    connect_attempts: int = 3,
    probe_timeout_s: float = 5.0,
    stop_grace_s: float = 30.0,
    speculative: SpeculativeLaunch | None = None,
    servers: Sequence[ServerSpec] | None = None,
) -> LaunchReport:
    """Make sure every server of ``gpu_hosts`` runs the run's model; return what was done.

    ``speculative``: the drafter flags this launch adds (None: the target alone); a server is
    reused only when its ``/server_info`` says it runs the same speculation. ``servers``: the
    deployment's servers this launch covers (default all; an evaluation splits them among
    its drafter configurations), each one of ``server_specs(settings)``.

    Raise SettingsError before touching a host when a server on a non-loopback host would
    have no API key (``key_problems``), and HostError when a host cannot be reached; on any
    exception what this launch already started or leased is released first (stopped unless
    another run leases it), so a launch failing on host 2 leaves nothing of it on host 1.
    Mismatched or failed servers do not raise: they are in ``report.problems`` (call
    ``report.raise_for_problems()``), so the report still reaches teardown. ``owner`` (e.g.
    ``"<dag_id>/<run_id>"``) names the run's lease on each server it uses and is written next
    to each server it starts: a retried launch task of the same run finds its own servers and
    keeps owning them. A server found loading (alive, port closed) is leased and reported as
    ``loading`` at once: the health gate waits for it up to ``launch_timeout_s``.
    """
    from include.settings.errors import SettingsError

    deployment = settings.deployment
    api_key = settings.api_key  # read from the connection now, masked in the task log
    problems = key_problems(deployment, api_key)
    if problems:
        raise SettingsError("; ".join(problems))
    expected = dataclasses.replace(ModelExpectation.from_settings(settings),
                                   speculative=speculative)
    specs = server_specs(settings)
    if servers is not None:
        specs = [trusted_spec(s.ident, specs) for s in servers]
    own_runners = runners is None
    runners = runners or Runners(connect_attempts=connect_attempts)
    report = LaunchReport([], expected, settings.launch_timeout_s, owner, deployment.sglang_conn_id)
    try:
        for spec in specs:
            outcome = _launch_one(
                spec, settings, expected, runners, owner,
                probe_timeout_s=probe_timeout_s, stop_grace_s=stop_grace_s,
            )  # fmt: skip
            log.info("server %s: %s %s", spec.name, outcome.action, outcome.detail)
            report.servers.append(outcome)
    except BaseException as exc:
        _undo(report, settings, runners, stop_grace_s, exc)
        raise
    finally:
        if own_runners:
            runners.close()
    return report


def _undo(report: LaunchReport, settings: RunSettings, runners: Runners, grace_s: float,
          exc: BaseException) -> None:
    """Release what a failed launch started or leased; say so on the exception."""
    if not any(run_holds(s) for s in report.servers):
        return
    try:
        undone = stop_servers(report, settings, runners=runners, grace_s=grace_s, check=False)
    except Exception as undo_exc:  # the launch error matters more; keep both
        exc.add_note(f"releasing the servers this launch started also failed: {undo_exc}")
        return
    lines = undone.stopped + undone.kept + undone.left_behind
    exc.add_note("released what this launch had started or leased:\n- " + "\n- ".join(lines))


def _launch_one(
    spec: ServerSpec,
    settings: RunSettings,
    expected: ModelExpectation,
    runners: Runners,
    owner: str | None,
    *,
    probe_timeout_s: float,
    stop_grace_s: float,
) -> ServerOutcome:
    key = settings.api_key
    replace, conn_id = settings.replace_mismatched_servers, settings.deployment.sglang_conn_id
    probe = probe_models(spec.url, key, probe_timeout_s)
    # Read only from a server that could be reused: its speculation must be the launch's too.
    info = (probe_server_info(spec.url, key, probe_timeout_s)
            if probe.answering and probe.status == 200 else None)
    status = read_process(runners, spec)
    owned = status.owned_by(owner)
    step, differences = launch_step(probe, status.alive, expected, replace_mismatched=replace,
                                    sglang_conn_id=conn_id, server_info=info)
    if step == "loading":
        # SGLang opens its port once its model is loaded (minutes): lease it, the gate waits.
        return _lease(spec, settings, runners, owner, owned, status, probe_timeout_s,
                      loading=True, speculative=expected.speculative)
    if step == "start":
        return _start(spec, settings, runners, owner, "started", expected.speculative)
    if step == "reuse":
        return _lease(spec, settings, runners, owner, owned, status, probe_timeout_s,
                      speculative=expected.speculative)
    if step == "refuse":
        return refused_outcome(spec, status, differences)
    release = _release(runners, spec, owner, stop_grace_s)
    port_answers = (release.get("outcome") == "not-running"
                    and probe_models(spec.url, None, 2.0).answering)
    blocked = replace_blocked(spec, status, release, differences, port_answers=port_answers)
    if blocked is not None:
        return blocked
    outcome = _start(spec, settings, runners, owner, "replaced", expected.speculative)
    outcome.differences = differences
    return outcome


def _lease(
    spec: ServerSpec,
    settings: RunSettings,
    runners: Runners,
    owner: str | None,
    owned: bool,
    status: ServerProcess,
    probe_timeout_s: float,
    *,
    loading: bool = False,
    speculative: SpeculativeLaunch | None = None,
) -> ServerOutcome:
    """Take this run's lease on a server answering (reuse) or loading; start it if it is gone."""
    outcome = loading_outcome if loading else reused_outcome
    if not owner:
        return outcome(spec, owner, owned, status)
    leased = ServerProcess.parse(
        run_on_host(runners, spec, build_acquire_command(spec.paths, owner),
                    timeout=LOCK_WAIT_S + 30).stdout
    )  # fmt: skip
    if stopped_meanwhile(status, leased) and not probe_models(
        spec.url, settings.api_key, probe_timeout_s
    ).answering:
        return _start(spec, settings, runners, owner, "started", speculative)
    return outcome(spec, owner, owned, status, leased)


def _start(
    spec: ServerSpec, settings: RunSettings, runners: Runners, owner: str | None, action: Action,
    speculative: SpeculativeLaunch | None = None,
) -> ServerOutcome:
    key = settings.api_key
    paths = spec.paths
    config = server_config_yaml(key).encode() if key else None
    launch = build_launch_command(spec, settings, config_file=paths.config_file if key else None,
                                  extra_args=speculative.flags() if speculative else ())
    log.info("server %s: launching on %s: %s", spec.name, runners.for_spec(spec).label, launch)
    command = build_detached_command(
        launch, paths, owner=owner, config_bytes=len(config) if config else None
    )
    out = run_on_host(runners, spec, command, timeout=LOCK_WAIT_S + 60, stdin=config)
    fields = parse_fields(out.stdout)
    pid = fields.get("pid", "")
    tail = "" if pid.isdigit() else fetch_log_tail(runners, spec, 30, secret=key)
    return started_outcome(spec, action, owner, pid, tail, already=fields.get("already") == "1")


def _release(
    runners: Runners, spec: ServerSpec, owner: str | None, grace_s: float
) -> dict[str, str]:
    command = build_release_command(spec.paths, owner, grace_s=grace_s)
    return parse_fields(
        run_on_host(runners, spec, command, timeout=LOCK_WAIT_S + grace_s + 30).stdout
    )


#: ``stop_servers``'s default owner: the one the report names.
_REPORT_OWNER: Any = object()


def stop_servers(
    report: LaunchReport | dict[str, Any],
    settings: RunSettings,
    *,
    owner: str | None = _REPORT_OWNER,
    runners: Runners | None = None,
    connect_attempts: int = 3,
    grace_s: float = 30.0,
    check: bool = True,
) -> StopReport:
    """Release this run's leases; stop each server no other run leases; confirm it is gone.

    ``report`` is the launch report (``to_dict`` data from XCom, or the object); every server
    in it is first matched against the deployment's servers of ``settings`` and the commands
    run with the deployment's facts, so a report naming a host, SSH connection or command
    prefix the deployment does not have raises XComMismatchError before any command runs.
    ``owner`` is the lease to release (the DAG passes its run's own, rebuilt from the run id,
    not XCom's); by default the report's.

    Servers the run neither started nor leased are skipped, and so is a reused server that
    no launcher started (no pid file: launched by hand). A stopped server counts as gone when
    its process group is dead and its port refuses connections. With ``check`` raise
    StopError (holding the StopReport) when a server to stop is left behind or its host
    cannot be reached.
    """
    if isinstance(report, dict):
        report = LaunchReport.from_dict(report, settings)
    specs = server_specs(settings)
    # An in-process report is matched too (all its facts): one rule, whoever built it.
    outcomes = [dataclasses.replace(o, server=trusted_spec(o.server.to_dict(), specs))
                for o in report.servers]
    lease = report.owner if owner is _REPORT_OWNER else owner
    own_runners = runners is None
    runners = runners or Runners(connect_attempts=connect_attempts)
    result = StopReport()
    try:
        for outcome in outcomes:
            _stop_one(outcome, lease, runners, grace_s, result)
    finally:
        if own_runners:
            runners.close()
    for line in result.stopped + result.kept:
        log.info("%s", line)
    if check and result.left_behind:
        raise StopError(
            "servers this run should have stopped are still running:\n- "
            + "\n- ".join(result.left_behind),
            result,
        )
    return result


def _stop_one(
    outcome: ServerOutcome, owner: str | None, runners: Runners, grace_s: float,
    result: StopReport,
) -> None:
    spec = outcome.server
    verdict = stop_verdict(outcome)
    if verdict is None:
        try:
            release = _release(runners, spec, owner, grace_s)
        except HostError as exc:
            verdict = ("left_behind", f"{spec.name}: {exc}")
        else:
            verdict = stop_verdict(outcome, release)
            if verdict is None:
                verdict = stop_verdict(outcome, release, port_answers=_port_answers(spec.url))
    bucket, line = verdict
    getattr(result, bucket).append(line)


def _port_answers(url: str, wait_s: float = 10.0) -> bool:
    """Return whether ``url`` still answers once a stopped server had ``wait_s`` to close it."""
    deadline = time.monotonic() + wait_s
    while probe_models(url, None, 2.0).answering and time.monotonic() < deadline:
        time.sleep(0.2)
    return probe_models(url, None, 2.0).answering
