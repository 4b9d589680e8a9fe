"""Start, reuse, replace and stop the SGLang servers of a run, over SSH or on this machine.

``launch_servers(settings)`` is idempotent: a server already answering ``/v1/models`` with the
run's model name and context length is reused; one answering with other settings is reported
(and replaced only with ``replace_mismatched_servers``); a silent port gets a new server. The
``LaunchReport`` it returns is JSON data for XCom and records which servers this run started,
so ``stop_servers(report)`` stops exactly those and never a server someone else is using.

Commands come from ``include.servers.commands`` and run through a ``HostRunner``: Airflow's
``SSHHook`` for a host with ``ssh_conn_id``, ``sh -c`` locally otherwise (same strings).
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from include.servers.checks import (
    ModelExpectation,
    served_model_differences,
    token_budget_problems,
)
from include.servers.commands import (
    ServerSpec,
    apply_prefix,
    build_detached_command,
    build_launch_command,
    build_log_tail_command,
    build_status_command,
    build_stop_command,
    parse_fields,
    server_specs,
)

if TYPE_CHECKING:
    from include.settings import RunSettings

log = logging.getLogger(__name__)

Action = Literal["started", "replaced", "reused", "mismatched", "failed"]


class HostError(RuntimeError):
    """A host cannot be reached or a command on it failed; the message names host and fix."""


@dataclass(frozen=True)
class CommandResult:
    """Hold what one shell command on a host returned."""

    exit_status: int
    stdout: str
    stderr: str


class HostRunner:
    """Run shell commands on one host; subclasses decide how (SSH or local)."""

    label: str = "this machine"

    def run(self, command: str, timeout: float = 60.0) -> CommandResult:  # pragma: no cover
        """Run ``command`` with ``sh`` on the host and return its status and output."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the connection, if any."""


class LocalRunner(HostRunner):
    """Run commands on this machine with ``sh -c`` (a host whose ``ssh_conn_id`` is empty)."""

    def run(self, command: str, timeout: float = 60.0) -> CommandResult:
        """Run ``command`` locally; raise HostError when it outlives ``timeout``."""
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HostError(f"{self.label}: command timed out after {timeout:.0f} s") from exc
        return CommandResult(
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )


class SSHRunner(HostRunner):
    """Run commands on a remote host through Airflow's ``SSHHook``, one connection reused.

    ``connect_attempts`` is passed to the hook (it waits 3-5 s between attempts); connection
    failures become HostError naming the connection and what to check.
    """

    def __init__(
        self, ssh_conn_id: str, host: str, *, connect_attempts: int = 3, conn_timeout: int = 15
    ) -> None:
        self.ssh_conn_id = ssh_conn_id
        self.label = f"host {host} (SSH connection `{ssh_conn_id}`)"
        self._connect_attempts = connect_attempts
        self._conn_timeout = conn_timeout
        self._hook: Any = None
        self._client: Any = None

    def _connect(self) -> Any:
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
        from airflow.providers.ssh.hooks.ssh import SSHHook

        try:
            self._hook = SSHHook(
                ssh_conn_id=self.ssh_conn_id,
                conn_timeout=self._conn_timeout,
                conn_retry_attempts=self._connect_attempts,
            )
            self._client = self._hook.get_conn()
        except Exception as exc:
            raise HostError(explain_ssh_error(exc, self.label)) from exc
        return self._client

    def run(self, command: str, timeout: float = 60.0) -> CommandResult:
        """Run ``command`` over SSH; raise HostError on connection failure or timeout."""
        client = self._connect()
        try:
            status, out, err = self._hook.exec_ssh_client_command(
                client, command, get_pty=False, environment=None, timeout=timeout
            )
        except Exception as exc:
            raise HostError(f"{self.label}: running a command failed: {exc}") from exc
        return CommandResult(status, out.decode(errors="replace"), err.decode(errors="replace"))

    def close(self) -> None:
        """Close the SSH connection."""
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


def explain_ssh_error(exc: BaseException, label: str) -> str:
    """Turn a paramiko/asyncssh connection error into a message saying what to fix."""
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    lowered = text.lower()
    if name == "BadHostKeyException" or "host key mismatch" in lowered or "changed" in lowered:
        return (
            f"{label}: the host key does not match the connection's `host_key` extra ({text}); "
            "if the host was reinstalled, update `host_key` with `ssh-keyscan -t ed25519 HOST`, "
            "otherwise do not connect (possible man-in-the-middle)"
        )
    if "not found in known_hosts" in lowered or "host key is not trusted" in lowered:
        return (
            f"{label}: the host key is unknown ({text}); put the host's public key with its "
            "type in the connection's `host_key` extra (e.g. 'ssh-ed25519 AAAA...', from "
            "`ssh-keyscan -t ed25519 HOST`) or add it to ~/.ssh/known_hosts"
        )
    if name in ("AuthenticationException", "PermissionDenied") or "authentication" in lowered:
        return (
            f"{label}: authentication failed ({text}); check the connection's `login` and that "
            "its `key_file`/`private_key` is authorised for that user on the host"
        )
    return f"{label}: cannot connect ({text}); check the connection's host and port"


class Runners:
    """Hand out one HostRunner per SSH connection (or the local one); close them all at exit."""

    def __init__(self, *, connect_attempts: int = 3) -> None:
        self._connect_attempts = connect_attempts
        self._runners: dict[str | None, HostRunner] = {}

    def for_spec(self, spec: ServerSpec) -> HostRunner:
        """Return the runner for the spec's host, creating it on first use."""
        key = spec.ssh_conn_id
        if key not in self._runners:
            self._runners[key] = (
                LocalRunner()
                if key is None
                else SSHRunner(key, spec.host, connect_attempts=self._connect_attempts)
            )
        return self._runners[key]

    def close(self) -> None:
        """Close every connection."""
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()

    def __enter__(self) -> Runners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_on_host(
    runners: Runners, spec: ServerSpec, command: str, *, timeout: float = 60.0
) -> CommandResult:
    """Run a command for one server (through its container prefix); raise HostError if it fails."""
    runner = runners.for_spec(spec)
    result = runner.run(apply_prefix(command, spec.command_prefix), timeout=timeout)
    if result.exit_status != 0:
        prefix = f" through command_prefix {spec.command_prefix!r}" if spec.command_prefix else ""
        raise HostError(
            f"server {spec.name} on {runner.label}: a command{prefix} exited with "
            f"{result.exit_status}: {(result.stderr or result.stdout).strip()[-800:]}"
        )
    return result


def fetch_log_tail(runners: Runners, spec: ServerSpec, lines: int = 60) -> str:
    """Return the last lines of a server's log, or a note saying why it could not be read."""
    try:
        return run_on_host(
            runners, spec, build_log_tail_command(spec.paths.log_file, lines), timeout=30
        ).stdout
    except HostError as exc:
        return f"(could not read {spec.paths.log_file}: {exc})"


@dataclass(frozen=True)
class ServerStatus:
    """Hold what the pid and owner files say about one server."""

    pid: int | None
    alive: bool
    owner: str


def server_status(runners: Runners, spec: ServerSpec) -> ServerStatus:
    """Return whether the server's pid file names a live server process, and its owner."""
    fields = parse_fields(run_on_host(runners, spec, build_status_command(spec.paths)).stdout)
    pid = fields.get("pid") or ""
    return ServerStatus(
        int(pid) if pid.isdigit() else None, fields.get("alive") == "1", fields.get("owner", "")
    )


@dataclass(frozen=True)
class ModelsProbe:
    """Hold one ``GET /v1/models`` outcome: ``answering`` False means nothing listens."""

    answering: bool
    status: int | None = None
    body: Any = None
    error: str = ""


def probe_models(url: str, api_key: str | None, timeout: float = 5.0) -> ModelsProbe:
    """GET ``url``/v1/models once; a refused or timed-out connection is ``answering=False``."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return ModelsProbe(True, exc.code, None, exc.read()[:300].decode(errors="replace"))
    except (urllib.error.URLError, OSError) as exc:
        return ModelsProbe(False, error=str(exc))
    try:
        return ModelsProbe(True, status, json.loads(raw))
    except ValueError:
        return ModelsProbe(True, status, None, f"not JSON: {raw[:200]!r}")


def probe_differences(probe: ModelsProbe, expected: ModelExpectation) -> list[str]:
    """Return how an answering server differs from the run ([] means reusable)."""
    if probe.status == 401:
        return ["answers 401 Unauthorized: its --api-key differs from setting `api_key`"]
    if probe.status != 200:
        return [f"/v1/models answered {probe.status}: {probe.error}"]
    return served_model_differences(probe.body, expected)


@dataclass
class ServerOutcome:
    """Record what ``launch_servers`` did with one server and why."""

    server: ServerSpec
    action: Action
    started_by_this_run: bool
    pid: int | None = None
    detail: str = ""
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data; ``from_dict`` inverts it."""
        return {
            "server": self.server.to_dict(),
            "action": self.action,
            "started_by_this_run": self.started_by_this_run,
            "pid": self.pid,
            "detail": self.detail,
            "differences": list(self.differences),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerOutcome:
        """Build from ``to_dict`` output."""
        return cls(
            server=ServerSpec.from_dict(data["server"]),
            action=data["action"],
            started_by_this_run=bool(data["started_by_this_run"]),
            pid=data.get("pid"),
            detail=data.get("detail", ""),
            differences=list(data.get("differences") or []),
        )


class LaunchError(RuntimeError):
    """Some servers cannot serve this run; the message lists each with its reason and fix."""


@dataclass
class LaunchReport:
    """Record the outcome of ``launch_servers`` for every server; JSON data via ``to_dict``.

    ``started`` are the servers this run owns (``stop_servers`` stops only those);
    ``problems`` are servers that will not serve this run (mismatched or failed to start).
    """

    servers: list[ServerOutcome]
    expected: ModelExpectation
    launch_timeout_s: float
    owner: str | None = None

    @property
    def started(self) -> list[ServerOutcome]:
        """Return the servers this run started (and therefore stops)."""
        return [s for s in self.servers if s.started_by_this_run]

    @property
    def problems(self) -> list[ServerOutcome]:
        """Return the servers that cannot serve this run."""
        return [s for s in self.servers if s.action in ("mismatched", "failed")]

    @property
    def urls(self) -> list[str]:
        """Return the URLs of servers that should serve this run (started, replaced, reused)."""
        return [s.server.url for s in self.servers if s.action not in ("mismatched", "failed")]

    def health_targets(self) -> list[dict[str, Any]]:
        """Return one ``ServerHealthSensor`` kwargs dict per server (for ``expand_kwargs``)."""
        return [
            {
                "server": s.server.to_dict(),
                "expected": self.expected.to_dict(),
                "timeout_s": self.launch_timeout_s,
            }
            for s in self.servers
        ]

    def summary(self) -> str:
        """Return one line per server for the task log."""
        lines = []
        for s in self.servers:
            pid = f" pid {s.pid}" if s.pid else ""
            why = f": {'; '.join(s.differences) or s.detail}" if s.differences or s.detail else ""
            lines.append(f"{s.server.name}: {s.action}{pid}{why}")
        return "\n".join(lines)

    def raise_for_problems(self) -> None:
        """Raise LaunchError listing every mismatched or failed server, if any."""
        if self.problems:
            raise LaunchError(
                "servers that cannot serve this run:\n"
                + "\n".join(
                    f"- {s.server.name}: {'; '.join(s.differences) or s.detail}"
                    for s in self.problems
                )
            )

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data for XCom; ``from_dict`` inverts it."""
        return {
            "servers": [s.to_dict() for s in self.servers],
            "expected": self.expected.to_dict(),
            "launch_timeout_s": self.launch_timeout_s,
            "owner": self.owner,
            "health_targets": self.health_targets(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchReport:
        """Build from ``to_dict`` output."""
        return cls(
            servers=[ServerOutcome.from_dict(s) for s in data["servers"]],
            expected=ModelExpectation.from_dict(data["expected"]),
            launch_timeout_s=float(data["launch_timeout_s"]),
            owner=data.get("owner"),
        )


def launch_servers(
    settings: RunSettings,
    *,
    owner: str | None = None,
    runners: Runners | None = None,
    connect_attempts: int = 3,
    starting_wait_s: float = 30.0,
    probe_timeout_s: float = 5.0,
    stop_grace_s: float = 30.0,
) -> LaunchReport:
    """Make sure every server of ``gpu_hosts`` runs the run's model; return what was done.

    Raise ValueError before touching a host when the token budget cannot work
    (``max_tokens`` >= ``context_length``), and HostError when a host cannot be reached.
    Mismatched or failed servers do not raise: they are in ``report.problems`` (call
    ``report.raise_for_problems()``), so the report of servers already started still reaches
    teardown. ``owner`` (e.g. ``"<dag_id>/<run_id>"``) is written next to each started server:
    a retried launch task of the same run finds its own servers and keeps owning them.
    ``starting_wait_s`` is how long a live server process that does not answer yet is given
    to open its port before it is reported as failed.
    """
    expected = ModelExpectation.from_settings(settings)
    if settings.api_key:
        _mask_in_task_logs(settings.api_key)
    budget = token_budget_problems(expected)
    if budget:
        raise ValueError("; ".join(budget))
    specs = server_specs(settings)
    own_runners = runners is None
    runners = runners or Runners(connect_attempts=connect_attempts)
    outcomes: list[ServerOutcome] = []
    try:
        for spec in specs:
            outcome = _launch_one(
                spec, settings, expected, runners, owner,
                starting_wait_s=starting_wait_s, probe_timeout_s=probe_timeout_s,
                stop_grace_s=stop_grace_s,
            )  # fmt: skip
            log.info("server %s: %s %s", spec.name, outcome.action, outcome.detail)
            outcomes.append(outcome)
    finally:
        if own_runners:
            runners.close()
    return LaunchReport(outcomes, expected, settings.launch_timeout_s, owner)


def _mask_in_task_logs(secret: str) -> None:
    """Register a secret with Airflow's log masker: SSHHook logs every command it runs."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # plain Python use without Airflow: nothing logs the commands
        return
    mask_secret(secret)


def _launch_one(
    spec: ServerSpec,
    settings: RunSettings,
    expected: ModelExpectation,
    runners: Runners,
    owner: str | None,
    *,
    starting_wait_s: float,
    probe_timeout_s: float,
    stop_grace_s: float,
) -> ServerOutcome:
    probe = probe_models(spec.url, settings.api_key, probe_timeout_s)
    status = server_status(runners, spec)
    owned = bool(owner) and status.owner == owner
    if not probe.answering and status.alive:
        # A process of ours is alive but its port is closed: still starting. Starting another
        # would only fail to bind, so give it time to open the port and then compare.
        deadline = time.monotonic() + starting_wait_s
        while not probe.answering and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            probe = probe_models(spec.url, settings.api_key, probe_timeout_s)
            if not server_status(runners, spec).alive:
                break
        if not probe.answering and server_status(runners, spec).alive:
            return ServerOutcome(
                spec, "failed", owned, status.pid,
                f"process {status.pid} (from {spec.paths.pid_file}) is alive but {spec.url} has "
                f"not answered for {starting_wait_s:.0f} s; stop it or check its log "
                f"{spec.paths.log_file}:\n{fetch_log_tail(runners, spec, 20)}",
            )  # fmt: skip
    if not probe.answering:
        return _start(spec, settings, runners, owner, "started")
    differences = probe_differences(probe, expected)
    if not differences:
        detail = "answers with the run's model and context length"
        if owned:
            detail += f"; started earlier by this run ({owner})"
        return ServerOutcome(spec, "reused", owned, status.pid, detail)
    if not settings.replace_mismatched_servers:
        return ServerOutcome(
            spec, "mismatched", False, status.pid,
            "left running; set `replace_mismatched_servers`: true to replace it", differences,
        )  # fmt: skip
    stop = _stop(runners, spec, stop_grace_s)
    if stop.get("outcome") == "not-running" and probe_models(spec.url, None, 2.0).answering:
        return ServerOutcome(
            spec, "failed", False, status.pid,
            f"cannot replace it: {spec.url} is served by a process not started from "
            f"{spec.paths.pid_file} (launched by hand or elsewhere); stop it yourself",
            differences,
        )  # fmt: skip
    if stop.get("outcome") == "still-alive":
        return ServerOutcome(
            spec, "failed", False, status.pid,
            f"cannot replace it: process {stop.get('pid')} survived SIGTERM and SIGKILL",
            differences,
        )  # fmt: skip
    outcome = _start(spec, settings, runners, owner, "replaced")
    outcome.differences = differences
    return outcome


def _start(
    spec: ServerSpec, settings: RunSettings, runners: Runners, owner: str | None, action: Action
) -> ServerOutcome:
    launch = build_launch_command(spec, settings)
    log.info(
        "server %s: launching on %s: %s", spec.name, runners.for_spec(spec).label,
        build_launch_command(spec, settings, redact_secrets=True),
    )  # fmt: skip
    out = run_on_host(
        runners, spec, build_detached_command(launch, spec.paths, owner=owner), timeout=60
    )
    pid = parse_fields(out.stdout).get("pid", "")
    if not pid.isdigit():
        # Owned anyway: the process may exist without its pid file; teardown then tries.
        return ServerOutcome(
            spec, "failed", True, None,
            f"no pid file {spec.paths.pid_file} appeared after launch; log tail:\n"
            + fetch_log_tail(runners, spec, 30),
        )  # fmt: skip
    return ServerOutcome(
        spec, action, True, int(pid), f"log {spec.paths.log_file}, pid file {spec.paths.pid_file}"
    )


def _stop(runners: Runners, spec: ServerSpec, grace_s: float) -> dict[str, str]:
    command = build_stop_command(spec.paths, grace_s=grace_s)
    return parse_fields(run_on_host(runners, spec, command, timeout=grace_s + 30).stdout)


@dataclass
class StopReport:
    """Record what ``stop_servers`` did: stopped servers and any left behind, with reasons."""

    stopped: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"stopped": self.stopped, "left_behind": self.left_behind, "skipped": self.skipped}


class StopError(RuntimeError):
    """Some servers this run started are still running; ``report`` says which and why."""

    def __init__(self, message: str, report: StopReport) -> None:
        super().__init__(message)
        self.report = report


def stop_servers(
    report: LaunchReport | dict[str, Any],
    *,
    runners: Runners | None = None,
    connect_attempts: int = 3,
    grace_s: float = 30.0,
    check: bool = True,
) -> StopReport:
    """Stop exactly the servers this run started, confirm they are gone, report the rest.

    Servers the run reused or left alone are skipped. A server counts as gone when its process
    group is dead and its port refuses connections. With ``check`` raise StopError (holding
    the StopReport) when any started server is left behind or its host cannot be reached.
    """
    if isinstance(report, dict):
        report = LaunchReport.from_dict(report)
    own_runners = runners is None
    runners = runners or Runners(connect_attempts=connect_attempts)
    result = StopReport()
    try:
        for outcome in report.servers:
            spec = outcome.server
            if not outcome.started_by_this_run:
                result.skipped.append(f"{spec.name}: {outcome.action}, not started by this run")
                continue
            try:
                fields = _stop(runners, spec, grace_s)
            except HostError as exc:
                result.left_behind.append(f"{spec.name}: {exc}")
                continue
            what = fields.get("outcome", "?")
            if what == "still-alive":
                result.left_behind.append(
                    f"{spec.name}: process {fields.get('pid')} survived SIGTERM and SIGKILL; "
                    f"stop it by hand on {spec.host}"
                )
                continue
            # The pid is gone; the port must be too, else something else serves it now.
            deadline = time.monotonic() + 10.0
            while probe_models(spec.url, None, 2.0).answering and time.monotonic() < deadline:
                time.sleep(0.2)
            if probe_models(spec.url, None, 2.0).answering:
                result.left_behind.append(
                    f"{spec.name}: process {fields.get('pid') or outcome.pid} is gone but "
                    f"{spec.url} still answers; find what listens on port {spec.port}"
                )
            else:
                result.stopped.append(f"{spec.name}: {what} pid {fields.get('pid') or '-'}")
    finally:
        if own_runners:
            runners.close()
    for line in result.stopped:
        log.info("stopped %s", line)
    if check and result.left_behind:
        raise StopError(
            "servers this run started are still running:\n- " + "\n- ".join(result.left_behind),
            result,
        )
    return result
