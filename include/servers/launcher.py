"""Start, reuse, replace and stop the SGLang servers of a run, over SSH or on this machine.

``launch_servers(settings, owner=...)`` is idempotent: each server is read first
(``_Shell.observe``: plain data), then ``include.servers.decisions`` decides (reuse, start,
loading, refuse, replace: its docstring's table) and names one command at a time; ``_Shell``
runs each and records its result, and decides nothing itself. Every server the run uses gets
the run's lease on its host; the ``LaunchReport`` returned is JSON data for XCom.
``stop_servers(report, settings)`` releases the run's leases and stops a server only when no
other run still leases it, and only the deployment's own servers (``trusted_spec``: never
taken from XCom).

The servers' API key reaches a server in its ``--config`` file, written from the SSH command's
stdin; it is in no command line, no report and no log tail this module returns.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from include.servers.commands import (
    ServerSpec,
    build_launch_command,
    parse_fields,
    server_config_yaml,
    server_specs,
)
from include.servers.decisions import (
    Command,
    ServerLaunch,
    StopBucket,
    next_command,
    plan_server,
    run_holds,
    stop_verdict,
)
from include.servers.expectations import ModelExpectation, SpeculativeLaunch, key_problems
from include.servers.hosts import HostError, Runners, fetch_log_tail, run_on_host
from include.servers.launch_report import (
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
from include.servers.observations import ModelsProbe, Observation, ServerProcess
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
    api_key = settings.api_key  # read from the connection once, masked in the task log
    problems = key_problems(deployment, api_key)
    if problems:
        raise SettingsError("; ".join(problems))
    expected = dataclasses.replace(ModelExpectation.from_settings(settings),
                                   speculative=speculative)
    specs = server_specs(settings)
    if servers is not None:
        specs = [trusted_spec(s.ident, specs) for s in servers]
    config = server_config_yaml(api_key).encode() if api_key else None
    extra = speculative.flags() if speculative else ()

    def launch_command(spec: ServerSpec) -> str:  # built only for a server to start
        return build_launch_command(spec, settings, extra_args=extra,
                                    config_file=spec.paths.config_file if config else None)

    own_runners = runners is None
    runners = runners or Runners(connect_attempts=connect_attempts)
    shell = _Shell(runners, owner, api_key, config, launch_command, probe_timeout_s,
                   stop_grace_s)
    report = LaunchReport([], expected, settings.launch_timeout_s, owner, deployment.sglang_conn_id)
    try:
        for spec in specs:
            launch = plan_server(spec, shell.observe(spec), expected, owner,
                                 replace_mismatched=settings.replace_mismatched_servers,
                                 sglang_conn_id=deployment.sglang_conn_id)
            outcome = shell.carry_out(launch)
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


@dataclass
class _Shell:
    """Run the commands the decisions name, on a server's host or port; decide nothing.

    Each command's result is read into plain data (a process record, a command's fields, a
    bool) for the decisions. ``launch_command``: a server's foreground launch command;
    ``config``: its ``--config`` file's bytes (the API key), sent on the command's stdin.
    """

    runners: Runners
    owner: str | None
    key: str | None = None
    config: bytes | None = None
    launch_command: Callable[[ServerSpec], str] | None = None
    probe_timeout_s: float = 5.0
    grace_s: float = 30.0

    def observe(self, spec: ServerSpec) -> Observation:
        """Read what is there: the port's answers, then the process record on the host."""
        probe = probe_models(spec.url, self.key, self.probe_timeout_s)
        # Read only from a server that could be reused: its speculation must be the launch's too.
        info = (probe_server_info(spec.url, self.key, self.probe_timeout_s)
                if probe.answering and probe.status == 200 else None)
        return Observation(probe, info, read_process(self.runners, spec))

    def carry_out(self, launch: ServerLaunch) -> ServerOutcome:
        """Run each command ``next_command`` names for ``launch`` until it gives the outcome."""
        step = next_command(launch)
        while isinstance(step, Command):
            launch = launch.record(step, self.execute(step, launch.spec))
            step = next_command(launch)
        return step

    def stop(self, outcome: ServerOutcome) -> tuple[StopBucket, str]:
        """Run each command ``stop_verdict`` names for a server until it gives the verdict."""
        released: Mapping[str, str] | None = None
        port_answers: bool | None = None
        step = stop_verdict(outcome)
        while isinstance(step, Command):
            if step is Command.RELEASE:
                try:
                    released = self.release(outcome.server)
                except HostError as exc:  # the teardown goes on with the other servers
                    released = {"outcome": "unreachable", "error": str(exc)}
            else:
                port_answers = self.execute(step, outcome.server)
            step = stop_verdict(outcome, released, port_answers=port_answers)
        return step

    def execute(self, command: Command, spec: ServerSpec) -> Any:
        """Run one command for ``spec``; return its result as plain data."""
        does: dict[Command, Callable[[ServerSpec], Any]] = {
            Command.LEASE: self.lease, Command.START: self.start,
            Command.READ_LOG: self.read_log, Command.RELEASE: self.release,
            Command.REPROBE: self.reprobe, Command.PORT_CHECK: self.port_check,
            Command.WAIT_CLOSED: self.wait_closed,
        }  # fmt: skip
        return does[command](spec)

    def lease(self, spec: ServerSpec) -> ServerProcess:
        command = build_acquire_command(spec.paths, self.owner or "")
        return ServerProcess.parse(
            run_on_host(self.runners, spec, command, timeout=LOCK_WAIT_S + 30).stdout)

    def start(self, spec: ServerSpec) -> dict[str, str]:
        assert self.launch_command is not None  # a teardown's shell starts nothing
        launch = self.launch_command(spec)
        log.info("server %s: launching on %s: %s", spec.name,
                 self.runners.for_spec(spec).label, launch)
        command = build_detached_command(launch, spec.paths, owner=self.owner,
                                         config_bytes=len(self.config) if self.config else None)
        out = run_on_host(self.runners, spec, command, timeout=LOCK_WAIT_S + 60,
                          stdin=self.config)
        return parse_fields(out.stdout)

    def read_log(self, spec: ServerSpec) -> str:
        return fetch_log_tail(self.runners, spec, 30, secret=self.key)

    def release(self, spec: ServerSpec) -> dict[str, str]:
        command = build_release_command(spec.paths, self.owner, grace_s=self.grace_s)
        return parse_fields(run_on_host(self.runners, spec, command,
                                        timeout=LOCK_WAIT_S + self.grace_s + 30).stdout)

    def reprobe(self, spec: ServerSpec) -> bool:
        return probe_models(spec.url, self.key, self.probe_timeout_s).answering

    def port_check(self, spec: ServerSpec) -> bool:
        # Without the key: what answers may be a process not started from our pid file.
        return probe_models(spec.url, None, 2.0).answering

    def wait_closed(self, spec: ServerSpec, wait_s: float = 10.0) -> bool:
        """Return whether the port still answers once a stopped server had ``wait_s`` to close."""
        deadline = time.monotonic() + wait_s
        while self.port_check(spec) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.port_check(spec)


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
    shell = _Shell(runners, lease, grace_s=grace_s)
    result = StopReport()
    try:
        for outcome in outcomes:
            bucket, line = shell.stop(outcome)
            getattr(result, bucket).append(line)
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
