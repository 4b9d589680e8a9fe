"""Build the shell commands that start, inspect and stop SGLang servers on a GPU host.

Every function here is pure: typed inputs in, one POSIX ``sh`` command string out. The same
string runs over SSH (``SSHHook.exec_command``) or locally (``sh -c``), so what the tests execute
is what a GPU host executes. Every value that comes from settings is ``shlex.quote``d; the
launch command and a container ``command_prefix`` are split into words with ``shlex.split`` and
each word is quoted again, so a setting can add arguments but never shell syntax (``;``, ``$(...)``,
redirections).

Each server owns three files under ``server_log_dir`` on its host, named by port
(``server-<port>.pid|.log|.owner``, see ``ServerPaths``): the pid is the server's own pid and
the leader of its process group, so stopping it stops its children (SGLang's scheduler and
detokenizer processes) too.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from include.settings import RunSettings

#: Host names that mean "this machine" besides 127.0.0.0/8.
_LOOPBACK_NAMES = ("localhost", "::1")


@dataclass(frozen=True)
class ServerPaths:
    """Name the files one server uses on its host: pid, log and owner files, keyed by port."""

    log_dir: str
    port: int

    @property
    def stem(self) -> str:
        """Return the common path prefix, ``<log_dir>/server-<port>``."""
        return f"{self.log_dir.rstrip('/')}/server-{self.port}"

    @property
    def pid_file(self) -> str:
        """Return the file holding the server's pid (also its process-group id)."""
        return self.stem + ".pid"

    @property
    def log_file(self) -> str:
        """Return the file the server's stdout and stderr go to."""
        return self.stem + ".log"

    @property
    def previous_log_file(self) -> str:
        """Return where the log of the previous launch on this port is kept."""
        return self.stem + ".log.prev"

    @property
    def owner_file(self) -> str:
        """Return the file naming who launched the server (e.g. the DAG run)."""
        return self.stem + ".owner"


@dataclass(frozen=True)
class ServerSpec:
    """Describe one server to run: where, on which GPUs, on which port, reached how.

    ``gpu`` is the first of ``cuda_devices`` (more than one when ``tp_size`` > 1) and names the
    server in logs. ``ssh_conn_id`` None means the host is this machine (no SSH).
    """

    host: str
    gpu: int
    port: int
    ssh_conn_id: str | None
    log_dir: str
    command_prefix: str | None = None
    cuda_devices: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.cuda_devices:
            object.__setattr__(self, "cuda_devices", (self.gpu,))

    @property
    def url(self) -> str:
        """Return the server's base URL (no trailing slash)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def name(self) -> str:
        """Return a short label for logs and errors: ``host:port (GPU i)``."""
        gpus = ",".join(str(g) for g in self.cuda_devices)
        return f"{self.host}:{self.port} (GPU {gpus})"

    @property
    def paths(self) -> ServerPaths:
        """Return this server's pid, log and owner files."""
        return ServerPaths(self.log_dir, self.port)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data (for XCom and trigger kwargs); ``from_dict`` inverts it."""
        data = asdict(self)
        data["cuda_devices"] = list(self.cuda_devices)
        data["url"] = self.url
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerSpec:
        """Build a spec from ``to_dict`` output (extra keys such as ``url`` are ignored)."""
        return cls(
            host=data["host"],
            gpu=int(data["gpu"]),
            port=int(data["port"]),
            ssh_conn_id=data.get("ssh_conn_id"),
            log_dir=data["log_dir"],
            command_prefix=data.get("command_prefix"),
            cuda_devices=tuple(int(g) for g in data.get("cuda_devices") or (data["gpu"],)),
        )


def server_specs(settings: RunSettings) -> list[ServerSpec]:
    """Expand ``gpu_hosts`` into one ServerSpec per server, in settings order.

    With ``tp_size`` N each server takes N consecutive entries of the host's ``gpus`` and
    serves on ``port_base`` + its first GPU. Raise ValueError naming the host and setting when
    the GPUs do not divide into servers or two servers would share a host and port.
    """
    specs: list[ServerSpec] = []
    seen: set[tuple[str, int]] = set()
    tp = settings.tp_size
    for h in settings.deployment.gpu_hosts:
        if not h.gpus:
            raise ValueError(f"setting `gpu_hosts` ({h.host}): `gpus` is empty; list GPU indices")
        if len(h.gpus) % tp:
            raise ValueError(
                f"setting `gpu_hosts` ({h.host}): {len(h.gpus)} GPUs {h.gpus} do not divide into "
                f"servers of tp_size={tp}; list a multiple of {tp} GPUs or change `tp_size`"
            )
        for i in range(0, len(h.gpus), tp):
            devices = tuple(h.gpus[i : i + tp])
            port = settings.deployment.port_base + devices[0]
            if (h.host, port) in seen:
                raise ValueError(
                    f"setting `gpu_hosts` ({h.host}): two servers would use port {port}; "
                    "list each host once and each GPU once"
                )
            seen.add((h.host, port))
            specs.append(
                ServerSpec(
                    host=h.host,
                    gpu=devices[0],
                    port=port,
                    ssh_conn_id=h.ssh_conn_id or None,
                    log_dir=settings.deployment.server_log_dir,
                    command_prefix=h.command_prefix or None,
                    cuda_devices=devices,
                )
            )
    return specs


def default_bind_host(host: str) -> str:
    """Return the address a server on ``host`` listens on: itself if loopback, else all.

    A server reached from another machine must listen beyond loopback; one reached at a
    loopback address should not be exposed to the network.
    """
    if host.startswith("127.") or host in _LOOPBACK_NAMES:
        return host
    return "0.0.0.0"


def _words(command: str) -> str:
    """Re-quote every word of an operator-given command so it cannot add shell syntax."""
    return " ".join(shlex.quote(w) for w in shlex.split(command))


def build_launch_command(
    spec: ServerSpec,
    settings: RunSettings,
    *,
    bind_host: str | None = None,
    redact_secrets: bool = False,
) -> str:
    """Return the foreground command that runs one server (env, launch command, flags).

    ``server_launch_command`` may hold several words (``python3 -m sglang.launch_server``,
    ``env PYTHONPATH=/x python -m sglang_standin``); ``extra_server_args`` are appended as
    separate arguments. With ``redact_secrets`` the API key is replaced by ``***`` (for logs).
    """
    args: list[str] = [
        "--model-path", settings.model_path,
        "--served-model-name", settings.model_name,
        "--host", bind_host or default_bind_host(spec.host),
        "--port", str(spec.port),
        "--context-length", str(settings.context_length),
        "--tp-size", str(settings.tp_size),
        "--mem-fraction-static", str(settings.mem_fraction_static),
    ]  # fmt: skip
    if settings.tokenizer_path:
        args += ["--tokenizer-path", settings.tokenizer_path]
    if settings.reasoning_parser:
        args += ["--reasoning-parser", settings.reasoning_parser]
    if settings.api_key:
        args += ["--api-key", "***" if redact_secrets else settings.api_key]
    args += list(settings.deployment.extra_server_args)
    devices = ",".join(str(g) for g in spec.cuda_devices)
    return (
        f"env CUDA_VISIBLE_DEVICES={shlex.quote(devices)} "
        f"{_words(settings.deployment.server_launch_command)} " + " ".join(shlex.quote(a) for a in args)
    )


def build_detached_command(
    launch_command: str,
    paths: ServerPaths,
    *,
    owner: str | None = None,
    pid_wait_s: float = 5.0,
) -> str:
    """Return a command that starts ``launch_command`` detached and prints ``pid=<N>``.

    The server runs in its own session (``setsid``; ``nohup`` where setsid is missing) with
    stdin from /dev/null and output appended to the log file, so it outlives the SSH session.
    The pid is written by the detached shell itself (``$$`` right before ``exec``), which is
    the server's pid and process-group id whether or not setsid forked. The previous log is
    kept as ``.log.prev``. Prints ``pid=`` (empty) when no pid file appeared in time.
    """
    q = shlex.quote
    inner = f"echo $$ > {q(paths.pid_file)}; exec {launch_command}"
    tries = max(1, int(pid_wait_s / 0.1))
    lines = [
        f"mkdir -p {q(paths.log_dir)}",
        f"rm -f {q(paths.pid_file)}",
        f"if [ -f {q(paths.log_file)} ]; then mv -f {q(paths.log_file)} "
        f"{q(paths.previous_log_file)}; fi",
        f"printf '%s\\n' {q(owner or '')} > {q(paths.owner_file)}",
        f"echo \"[launcher] $(date '+%Y-%m-%d %H:%M:%S') starting on $(hostname)\" "
        f"> {q(paths.log_file)}",
        "if command -v setsid >/dev/null 2>&1; then run=setsid; else run=nohup; fi",
        f"$run sh -c {q(inner)} </dev/null >>{q(paths.log_file)} 2>&1 &",
        f"i=0; while [ ! -s {q(paths.pid_file)} ] && [ $i -lt {tries} ]; do "
        "sleep 0.1; i=$((i+1)); done",
        f'echo "pid=$(cat {q(paths.pid_file)} 2>/dev/null)"',
    ]
    return "\n".join(lines)


# Shell helpers shared by the status and stop commands. A pid counts as this server only if
# it is alive, not a zombie and its command line holds "--port <port>": a pid file outliving a
# reboot may name an unrelated process that must never be signalled.
def _shell_helpers(port: int) -> str:
    return "\n".join(
        [
            "is_server() {",
            '  kill -0 "$1" 2>/dev/null || return 1',
            '  st=$(sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f1)',
            '  [ "$st" = Z ] && return 1',
            '  [ -r /proc/"$1"/cmdline ] || return 0',
            f'  tr "\\000" " " < /proc/"$1"/cmdline | grep -q -- "--port {int(port)} "',
            "}",
        ]
    )


def _read_pid(pid_file: str) -> str:
    q = shlex.quote
    return "\n".join(
        [
            f"pid=$(head -c 32 {q(pid_file)} 2>/dev/null | tr -cd 0-9)",
            # A pid of 0 or 1 would turn `kill -- -$pid` into a broadcast; never allow it.
            'if [ -n "$pid" ] && [ "$pid" -le 1 ]; then pid=; fi',
        ]
    )


def build_status_command(paths: ServerPaths) -> str:
    """Return a command printing ``pid=<N|> alive=<0|1> owner=<text>`` for one server.

    ``alive=1`` only when the pid file names a live, non-zombie process serving this port.
    The command always exits 0; a non-zero exit means the host or prefix itself failed.
    """
    q = shlex.quote
    return "\n".join(
        [
            _shell_helpers(paths.port),
            _read_pid(paths.pid_file),
            'alive=0; if [ -n "$pid" ] && is_server "$pid"; then alive=1; fi',
            f"owner=$(head -n 1 {q(paths.owner_file)} 2>/dev/null)",
            'echo "pid=$pid alive=$alive owner=$owner"',
        ]
    )


def build_stop_command(paths: ServerPaths, *, grace_s: float = 20.0) -> str:
    """Return a command that stops one server by its pid file and prints the outcome.

    SIGTERM goes to the whole process group, then the command waits up to ``grace_s``, then
    SIGKILLs the group and waits 5 s more. Output is one line: ``stopped pid=N``,
    ``not-running pid=N`` (stale or missing pid file) or ``still-alive pid=N``; the pid file is
    removed unless the process survived.
    """
    q = shlex.quote
    tries = max(1, int(grace_s / 0.2))
    return "\n".join(
        [
            _shell_helpers(paths.port),
            _read_pid(paths.pid_file),
            'if [ -z "$pid" ] || ! is_server "$pid"; then',
            f'  rm -f {q(paths.pid_file)}; echo "not-running pid=$pid"; exit 0',
            "fi",
            'kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null',
            f'i=0; while is_server "$pid" && [ $i -lt {tries} ]; do sleep 0.2; i=$((i+1)); done',
            'if is_server "$pid"; then',
            '  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null',
            '  i=0; while is_server "$pid" && [ $i -lt 25 ]; do sleep 0.2; i=$((i+1)); done',
            "fi",
            'if is_server "$pid"; then echo "still-alive pid=$pid"; exit 0; fi',
            f'rm -f {q(paths.pid_file)}; echo "stopped pid=$pid"',
        ]
    )


def build_log_tail_command(log_file: str, lines: int = 60) -> str:
    """Return a command printing the last ``lines`` lines of a log (nothing if it is missing)."""
    return f"tail -n {int(lines)} {shlex.quote(log_file)} 2>/dev/null || true"


def apply_prefix(command: str, command_prefix: str | None) -> str:
    """Return ``command`` run through the host's container prefix, or unchanged without one.

    The whole command becomes one argument of ``sh -c`` after the prefix's own words
    (``pct exec 200 -- sh -c '...'``, ``docker exec NAME sh -c '...'``), so every step,
    including the detached launch, runs inside the container.
    """
    if not command_prefix or not command_prefix.strip():
        return command
    return f"{_words(command_prefix)} sh -c {shlex.quote(command)}"


def parse_fields(output: str) -> dict[str, str]:
    """Parse the last ``key=value ...`` line a status/launch/stop command printed.

    The ``owner`` value runs to the end of the line (it may hold spaces).
    """
    lines = [ln for ln in output.strip().splitlines() if "=" in ln]
    if not lines:
        return {}
    line = lines[-1].strip()
    fields: dict[str, str] = {}
    head, sep, owner = line.partition("owner=")
    if sep:
        fields["owner"] = owner.strip()
    for word in head.split():
        key, _, value = word.partition("=")
        if _:
            fields[key] = value
        else:
            fields["outcome"] = key
    return fields
