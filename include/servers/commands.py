"""Describe a run's servers and build the commands that run them on a GPU host.

Every function here is pure: typed inputs in, one POSIX ``sh`` command string out. The same
string runs over SSH (``SSHHook.exec_command``) or locally (``sh -c``), so what the tests execute
is what a GPU host executes. Every value that comes from settings is ``shlex.quote``d; the
launch command and a container ``command_prefix`` are split into words with ``shlex.split`` and
each word is quoted again, so a setting can add arguments but never shell syntax (``;``, ``$(...)``,
redirections). The commands that start, lease and stop a server process are in
``include.servers.lifecycle``.

Each server owns a few files under ``server_log_dir`` on its host, named by port
(``server-<port>.*``, see ``ServerPaths``). The API key is never in a command line: it is in
the server's ``--config`` YAML file (``server_config_yaml``, mode 0600).

Where a server runs and how it is reached are deployment facts, rebuilt by ``server_specs``
in every task; XCom carries only ``ServerSpec.ident`` (see ``include.servers.launch_report``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from include.settings import RunSettings


@dataclass(frozen=True)
class ServerPaths:
    """Name the files one server uses on its host, keyed by port.

    The pid file names the server's own pid, also the leader of its process group, so
    stopping the group stops SGLang's scheduler and detokenizer processes too.
    """

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

    @property
    def config_file(self) -> str:
        """Return the server's ``--config`` YAML file (the API key, 0600; SGLang takes .yaml)."""
        return self.stem + ".config.yaml"

    @property
    def lease_dir(self) -> str:
        """Return the directory holding one lease file per run that uses the server."""
        return self.stem + ".leases"

    @property
    def lock_dir(self) -> str:
        """Return the lock directory earlier releases used (never created any more)."""
        return self.stem + ".lock"

    @property
    def lock_file(self) -> str:
        """Return the file whose ``flock`` locks the server's leases and process."""
        return self.stem + ".flock"


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
    def address(self) -> str:
        """Return ``host:port`` (an IPv6 host in brackets), as identifiers are shown."""
        return format_address(self.host, self.port)

    @property
    def name(self) -> str:
        """Return a short label for logs and errors: ``host:port (GPU i)``."""
        gpus = ",".join(str(g) for g in self.cuda_devices)
        return f"{self.host}:{self.port} (GPU {gpus})"

    @property
    def paths(self) -> ServerPaths:
        """Return this server's pid, log and owner files."""
        return ServerPaths(self.log_dir, self.port)

    @property
    def ident(self) -> dict[str, Any]:
        """Return the server's identifier, all of it XCom carries: ``{"host", "port"}``."""
        return {"host": self.host, "port": self.port}

    def to_dict(self) -> dict[str, Any]:
        """Return every fact, for trigger kwargs (Airflow's database, not XCom).

        ``from_dict`` inverts it. XCom gets ``ident`` only: see ``trusted_spec``.
        """
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


def format_address(host: str, port: int) -> str:
    """Return ``host:port``, an IPv6 host in brackets (as in a URL)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def default_bind_host(host: str) -> str:
    """Return the address a server on ``host`` listens on: itself if loopback (not exposed to
    the network), else all (reached from another machine)."""
    from include.settings.deployment import GpuHost

    return host if GpuHost(host=host).is_loopback else "0.0.0.0"


def _words(command: str) -> str:
    """Re-quote every word of an operator-given command so it cannot add shell syntax."""
    return " ".join(shlex.quote(w) for w in shlex.split(command))


def build_launch_command(
    spec: ServerSpec,
    settings: RunSettings,
    *,
    bind_host: str | None = None,
    config_file: str | None = None,
    extra_args: Sequence[str] = (),
) -> str:
    """Return the foreground command that runs one server (env, launch command, flags).

    ``server_launch_command`` may hold several words (``python3 -m sglang.launch_server``,
    ``env PYTHONPATH=/x python -m sglang_standin``); ``extra_server_args`` are appended as
    separate arguments, then this launch's own ``extra_args`` (a drafter's speculative flags:
    typed numbers and a deployment path, each quoted). Nothing secret is in it: the API key
    is in ``config_file`` (``--config``, see ``server_config_yaml``), so the command can be
    logged and shows in ``ps`` harmlessly.
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
    if settings.server_tokenizer_path:
        args += ["--tokenizer-path", settings.server_tokenizer_path]
    if settings.reasoning_parser:
        args += ["--reasoning-parser", settings.reasoning_parser]
    if config_file:
        args += ["--config", config_file]
    args += list(settings.deployment.extra_server_args)
    args += [str(a) for a in extra_args]
    devices = ",".join(str(g) for g in spec.cuda_devices)
    program = _words(settings.deployment.server_launch_command)
    return (
        f"env CUDA_VISIBLE_DEVICES={shlex.quote(devices)} {program} "
        + " ".join(shlex.quote(a) for a in args)
    )


def server_config_yaml(api_key: str) -> str:
    """Return the ``--config`` file content that gives a server ``api_key``.

    SGLang turns each key of the file into a long option placed before the command line's
    (``api-key: K`` becomes ``--api-key K``), so the command line still wins for any other
    flag. The value is always a double-quoted YAML string, so a key such as ``yes`` or ``0x10``
    stays text instead of becoming a boolean or a number.
    """
    return yaml.safe_dump({"api-key": api_key}, default_style='"', allow_unicode=True)


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


#: Fields whose value runs to the end of the line (they may hold spaces).
_TAIL_FIELDS = ("owner", "holders")


def parse_fields(output: str) -> dict[str, str]:
    """Parse the last ``key=value ...`` line a status/launch/stop/release command printed.

    An ``owner`` or ``holders`` value runs to the end of the line (it may hold spaces); a word
    without ``=`` is the ``outcome`` (``stopped``, ``kept``...).
    """
    lines = [ln for ln in output.strip().splitlines() if "=" in ln]
    if not lines:
        return {}
    head = lines[-1].strip()
    fields: dict[str, str] = {}
    for name in _TAIL_FIELDS:
        before, sep, rest = head.partition(f"{name}=")
        if sep and (not before or before.endswith(" ")):
            fields[name] = rest.strip()
            head = before
            break
    for word in head.split():
        key, _, value = word.partition("=")
        if _:
            fields[key] = value
        else:
            fields["outcome"] = key
    return fields


def redact(text: str, secret: str | None) -> str:
    """Return ``text`` with ``secret`` replaced by ``***``: a server's log holds its API key
    (``include.servers.lifecycle``), so a tail is redacted before a message, XCom or event."""
    return text.replace(secret, "***") if secret else text
