"""Run the servers' shell commands on their GPU hosts: over SSH, or on this machine.

A ``HostRunner`` runs one command string with ``sh``: Airflow's ``SSHHook`` for a host with an
``ssh_conn_id``, ``sh -c`` locally otherwise (the same strings, from
``include.servers.commands`` and ``include.servers.lifecycle``). It is the only way this
project runs a command on a host: the launcher calls it directly, the health trigger in a
worker thread, so host-key pinning and the container prefix are applied in one place. A
command may be given bytes on its stdin: that is how a secret (the servers' API key) reaches
a host without ever being part of a command line, which other users of the host can read in
``ps``.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from typing import Any

from include.servers.commands import ServerSpec, apply_prefix, build_log_tail_command, redact

log = logging.getLogger(__name__)


class HostError(RuntimeError):
    """A host cannot be reached or a command on it failed; the message names host and fix."""


def _true(value: Any) -> bool:
    return str(value).strip().lower() == "true"


def host_key_problems(ssh_conn_id: str, extra: dict[str, Any]) -> list[str]:
    """Return why an SSH connection to a GPU host does not pin its host key ([]: it does).

    The commands sent to a GPU host start servers and carry their API key on stdin: a host
    that cannot prove who it is must not receive them. A connection must give the host's
    public key (``host_key`` extra) and must not turn the check off.
    """
    fix = ("put the host's public key with its type in the `host_key` extra (e.g. "
           "'ssh-ed25519 AAAA...', from `ssh-keyscan -t ed25519 HOST`)")
    problems = []
    if _true(extra.get("no_host_key_check")) or _true(extra.get("ignore_hostkey_verification")):
        problems.append(f"SSH connection `{ssh_conn_id}` sets `no_host_key_check`: it would "
                        f"connect to any machine answering at that address; remove it and {fix}")
    if _true(extra.get("allow_host_key_change")):
        problems.append(f"SSH connection `{ssh_conn_id}` sets `allow_host_key_change`: a "
                        "changed host key would be accepted; remove it")
    if not str(extra.get("host_key") or "").strip():
        problems.append(f"SSH connection `{ssh_conn_id}`: the host key is unknown (no "
                        f"`host_key` extra); {fix}")
    return problems


def connection_problems(ssh_conn_id: str) -> list[str]:
    """Return why the GPU host's SSH connection cannot be used ([]: it pins its host key).

    The one reader of an SSH connection's extras: ``check_settings`` lists these problems
    before any work, and ``SSHRunner`` refuses to connect on any of them.
    """
    from airflow.sdk import BaseHook

    try:
        extra = BaseHook.get_connection(ssh_conn_id).extra_dejson
    except Exception as exc:  # noqa: BLE001 - not found, or a broken secrets backend
        return [f"cannot read SSH connection `{ssh_conn_id}` ({exc}); define it"]
    return host_key_problems(ssh_conn_id, extra if isinstance(extra, dict) else {})


@dataclass(frozen=True)
class CommandResult:
    """Hold what one shell command on a host returned."""

    exit_status: int
    stdout: str
    stderr: str


class HostRunner:
    """Run shell commands on one host; subclasses decide how (SSH or local)."""

    label: str = "this machine"

    def execute(
        self, command: str, timeout: float = 60.0, stdin: bytes | None = None
    ) -> CommandResult:  # pragma: no cover
        """Run ``command`` with ``sh`` on the host, ``stdin`` on its input; return the outcome."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the connection, if any."""


class LocalRunner(HostRunner):
    """Run commands on this machine with ``sh -c`` (a host whose ``ssh_conn_id`` is empty)."""

    def execute(
        self, command: str, timeout: float = 60.0, stdin: bytes | None = None
    ) -> CommandResult:
        """Run ``command`` locally; raise HostError when it outlives ``timeout``."""
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                capture_output=True,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
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

        problems = connection_problems(self.ssh_conn_id)
        if problems:
            raise HostError(f"{self.label}: " + "; ".join(problems))
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

    def execute(
        self, command: str, timeout: float = 60.0, stdin: bytes | None = None
    ) -> CommandResult:
        """Run ``command`` over SSH; raise HostError on connection failure or timeout."""
        client = self._connect()
        try:
            if stdin is None:
                status, out, err = self._hook.exec_ssh_client_command(
                    client, command, get_pty=False, environment=None, timeout=timeout
                )
            else:
                status, out, err = _exec_with_stdin(client, command, stdin, timeout)
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


def _exec_with_stdin(
    client: Any, command: str, data: bytes, timeout: float
) -> tuple[int, bytes, bytes]:
    """Run ``command`` on a paramiko client with ``data`` on its stdin (the hook has no stdin).

    ``timeout`` bounds every wait for output; the commands given stdin here print little, so
    reading stdout to its end before stderr cannot block on a full stderr buffer.
    """
    log.info("Running command (%d bytes on its stdin): %s", len(data), command)
    channel_in, channel_out, channel_err = client.exec_command(command, timeout=timeout)
    channel_in.write(data)
    channel_in.flush()
    channel_in.channel.shutdown_write()
    out = channel_out.read()
    err = channel_err.read()
    return channel_out.channel.recv_exit_status(), out, err


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
    runners: Runners,
    spec: ServerSpec,
    command: str,
    *,
    timeout: float = 60.0,
    stdin: bytes | None = None,
) -> CommandResult:
    """Run a command for one server (through its container prefix); raise HostError if it fails.

    With ``stdin`` the container prefix must pass its input on (``docker exec -i``).
    """
    runner = runners.for_spec(spec)
    result = runner.execute(apply_prefix(command, spec.command_prefix), timeout=timeout,
                            stdin=stdin)
    if result.exit_status != 0:
        prefix = f" through command_prefix {spec.command_prefix!r}" if spec.command_prefix else ""
        raise HostError(
            f"server {spec.name} on {runner.label}: a command{prefix} exited with "
            f"{result.exit_status}: {(result.stderr or result.stdout).strip()[-800:]}"
        )
    return result


def run_once_on_host(spec: ServerSpec, command: str, *, timeout: float = 30.0) -> str:
    """Run one command for a server as ``run_on_host`` does, on a connection of its own with one
    attempt (the health trigger checks again at its next interval); return its stdout."""
    with Runners(connect_attempts=1) as runners:
        return run_on_host(runners, spec, command, timeout=timeout).stdout


def fetch_log_tail(
    runners: Runners, spec: ServerSpec, lines: int = 60, *, secret: str | None = None
) -> str:
    """Return the last lines of a server's log with ``secret`` redacted, or why it cannot be read.

    SGLang logs its arguments, API key included, so pass the key as ``secret``.
    """
    try:
        tail = run_on_host(
            runners, spec, build_log_tail_command(spec.paths.log_file, lines), timeout=30
        ).stdout
    except HostError as exc:
        return f"(could not read {spec.paths.log_file}: {exc})"
    return redact(tail, secret)
