"""What launching and stopping a run's servers did, as JSON data for XCom; XCom's trust rule.

``LaunchReport`` records, per server, what the launch did and whether this run started it and
holds a lease on it (a server's leases: ``include.servers.lifecycle``), so teardown
(``stop_servers``) releases exactly this run's. It holds no secret: the health gate reads the
API key from the deployment's connection (``sglang_conn_id``) itself.

XCom is not trusted: Op and Admin users can edit it over the REST API. So a server crosses it
as its identifier only (``ServerSpec.ident``, ``{"host", "port"}``), and every task rebuilds
the server's facts (SSH connection, command prefix, log directory, URL) from the deployment
settings: ``trusted_spec`` / ``trusted_urls`` match identifiers against ``server_specs`` and
refuse one the deployment does not list (``XComMismatchError``), so an edited XCom can neither
run a command prefix on a host nor send the API key to a URL of its choosing. The model
expectation, launch timeout and key connection are rebuilt from the settings too
(``LaunchReport.from_dict``). The monitor, which has no run settings, probes only what
``own_server_url`` finds among the deployment's ``server_addresses``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from include.servers.commands import ServerSpec, format_address, server_specs
from include.servers.expectations import ModelExpectation

if TYPE_CHECKING:
    from include.settings import DeploymentSettings, RunSettings


class XComMismatchError(ValueError):
    """A server named in XCom is not one of the deployment's, or XCom's facts differ from its."""


#: Facts XCom may carry beside an identifier (``url``, for people reading it; every fact, in
#: reports of older releases). Never used: one that differs from the deployment's means an
#: edited (or stale) XCom, refused.
_FACTS = ("gpu", "ssh_conn_id", "log_dir", "command_prefix", "cuda_devices", "url")


def _specs_of(trusted: RunSettings | Sequence[ServerSpec]) -> list[ServerSpec]:
    return server_specs(trusted) if hasattr(trusted, "deployment") else list(trusted)


def _host_port(identifier: Any) -> tuple[str, int] | None:
    """Return the ``(host, port)`` an identifier names: ``{"host", "port"}`` or ``host:port``."""
    if isinstance(identifier, Mapping):
        host, port = identifier.get("host"), identifier.get("port")
    elif isinstance(identifier, str):
        host, _, port = identifier.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    else:
        return None
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if not isinstance(host, str) or not host or type(port) is not int:
        return None
    return host, port


def ident_address(identifier: Any) -> str:
    """Return ``host:port`` of a server identifier, for messages (a bounded repr if malformed)."""
    key = _host_port(identifier)
    return format_address(*key) if key else _shown(identifier)


def _shown(value: Any) -> str:
    # An edited XCom may hold anything, of any size: the message shows a bounded repr.
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "...'"


def _mismatch(what: str) -> XComMismatchError:
    return XComMismatchError(
        f"{what}: XCom did not match the deployment; refusing it (a server's host, SSH "
        "connection, command prefix and log directory come from deployment settings "
        "`gpu_hosts`, `port_base` and `server_log_dir` and the run's `tp_size`, never from "
        "XCom: was the launch report edited, or the deployment changed since the launch?)"
    )


def trusted_spec(identifier: Any, trusted: RunSettings | Sequence[ServerSpec]) -> ServerSpec:
    """Return the deployment's own ServerSpec for a server identifier read from XCom.

    ``identifier`` is ``ServerSpec.ident`` (``{"host", "port"}``) or ``"host:port"``;
    ``trusted`` is the run's settings (``server_specs`` is rebuilt from them) or the specs.
    Raise XComMismatchError naming the identifier when the deployment has no such server, or
    when the identifier also carries a fact (``command_prefix``, ``ssh_conn_id`` ...) other
    than the deployment's: every fact returned is the deployment's, none is XCom's.
    """
    specs = _specs_of(trusted)
    key = _host_port(identifier)
    spec = next((s for s in specs if (s.host, s.port) == key), None)
    if spec is None:
        ours = ", ".join(s.address for s in specs) or "none"
        raise _mismatch(
            f"server {_shown(identifier)} named in XCom is not one of the deployment's "
            f"servers ({ours})"
        )
    if isinstance(identifier, Mapping):
        facts = spec.to_dict()
        for name in _FACTS:
            if name in identifier and identifier[name] != facts[name]:
                raise _mismatch(
                    f"server {spec.address} in XCom has {name}={_shown(identifier[name])} but "
                    f"the deployment's is {facts[name]!r}"
                )
    return spec


def trusted_urls(servers: Any, trusted: RunSettings | Sequence[ServerSpec]) -> list[str]:
    """Return the deployment's own URL of each server identifier in ``servers`` (from XCom),
    or raise XComMismatchError (``trusted_spec``) before any request."""
    if isinstance(servers, (str, Mapping)) or not isinstance(servers, Iterable):
        raise _mismatch(f"servers {_shown(servers)} in XCom are not a list of identifiers")
    specs = _specs_of(trusted)
    return [trusted_spec(s, specs).url for s in servers]


def server_addresses(deployment: DeploymentSettings) -> frozenset[tuple[str, int]]:
    """Return every ``(host, port)`` a server of the deployment may serve on, any ``tp_size``
    (``port_base`` + each listed GPU: no run's settings needed, the monitor's case).

    Hosts are lower case, as URLs compare them.
    """
    return frozenset((h.host.lower(), deployment.port_base + g)
                     for h in deployment.gpu_hosts for g in h.gpus)


def own_server_url(url: Any, addresses: Collection[tuple[str, int]]) -> str | None:
    """Return the canonical ``http://host:port`` of ``url`` if it is one of ``addresses``.

    None for anything else: another scheme (``file://``, ``https``, ``ftp``), credentials,
    a path, a query, no port, or a host and port the deployment does not list.
    """
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if (parts.scheme != "http" or host is None or port is None or parts.username is not None
            or parts.password is not None or parts.path not in ("", "/")
            or parts.query or parts.fragment or (host, port) not in addresses):
        return None
    return "http://" + format_address(host, port)


#: ``loading``: found alive with its port closed, loading its model (leased; the gate waits).
Action = Literal["started", "replaced", "reused", "loading", "mismatched", "failed"]


@dataclass
class ServerOutcome:
    """Record what ``launch_servers`` did with one server and why.

    ``started_by_this_run``: this run launched the process (teardown checks its port closed).
    ``leased``: this run holds a lease on it (teardown releases it; the last lease stops it).
    """

    server: ServerSpec
    action: Action
    started_by_this_run: bool
    pid: int | None = None
    detail: str = ""
    differences: list[str] = field(default_factory=list)
    leased: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data for XCom; the server as its identifier (and URL, to read)."""
        return {
            "server": {**self.server.ident, "url": self.server.url},
            "action": self.action,
            "started_by_this_run": self.started_by_this_run,
            "pid": self.pid,
            "detail": self.detail,
            "differences": list(self.differences),
            "leased": self.leased,
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], trusted: RunSettings | Sequence[ServerSpec]
    ) -> ServerOutcome:
        """Build from ``to_dict`` output, the server being the deployment's (``trusted_spec``)."""
        return cls(
            server=trusted_spec(data["server"], trusted),
            action=data["action"],
            started_by_this_run=bool(data["started_by_this_run"]),
            pid=data.get("pid"),
            detail=data.get("detail", ""),
            differences=list(data.get("differences") or []),
            leased=bool(data.get("leased", False)),
        )


class LaunchError(RuntimeError):
    """Some servers cannot serve this run; the message lists each with its reason and fix."""


@dataclass
class LaunchReport:
    """Record the outcome of ``launch_servers`` for every server; JSON data via ``to_dict``.

    ``started`` are the servers this run launched; ``problems`` are servers that will not
    serve this run (mismatched or failed to start); a server found loading is neither: it
    serves the run once the health gate saw it answer. ``sglang_conn_id`` names the Airflow
    connection whose password is the servers' API key. Read back from XCom (``from_dict``),
    everything but ``owner`` and what the launch did is rebuilt from the run's settings.
    """

    servers: list[ServerOutcome]
    expected: ModelExpectation
    launch_timeout_s: float
    owner: str | None = None
    sglang_conn_id: str | None = None

    @property
    def started(self) -> list[ServerOutcome]:
        """Return the servers this run started."""
        return [s for s in self.servers if s.started_by_this_run]

    @property
    def problems(self) -> list[ServerOutcome]:
        """Return the servers that cannot serve this run."""
        return [s for s in self.servers if s.action in ("mismatched", "failed")]

    @property
    def usable(self) -> list[ServerSpec]:
        """Return the servers for this run: started, replaced, reused, loading."""
        return [s.server for s in self.servers if s.action not in ("mismatched", "failed")]

    @property
    def urls(self) -> list[str]:
        """Return the URLs of the servers for this run (``usable``)."""
        return [spec.url for spec in self.usable]

    @property
    def idents(self) -> list[dict[str, Any]]:
        """Return the identifiers of the servers for this run, for XCom (``trusted_urls``)."""
        return [spec.ident for spec in self.usable]

    def health_targets(self) -> list[dict[str, Any]]:
        """Return each server's identifier only, the sensor's ``.expand(server=...)``."""
        return [s.server.ident for s in self.servers]

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
            "sglang_conn_id": self.sglang_conn_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], settings: RunSettings) -> LaunchReport:
        """Build from ``to_dict`` output (XCom) and the run's settings.

        Each server is the deployment's own (``trusted_spec``; XComMismatchError for one it
        does not list); the expectation, timeout and key connection are the settings', not
        XCom's. ``owner`` is XCom's: teardown passes the run's own (``stop_servers``).
        """
        specs = server_specs(settings)
        return cls(
            servers=[ServerOutcome.from_dict(s, specs) for s in data["servers"]],
            expected=ModelExpectation.from_settings(settings),
            launch_timeout_s=float(settings.launch_timeout_s),
            owner=data.get("owner"),
            sglang_conn_id=settings.deployment.sglang_conn_id,
        )


@dataclass
class StopReport:
    """Record what ``stop_servers`` did, one line per server, by outcome.

    ``kept``: this run's lease released, the server left to the runs still leasing it.
    """

    stopped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Return one line per server, by outcome, for the task log."""
        lines = [f"{what}: {line}" for what, lines in self.to_dict().items() for line in lines]
        return "\n".join(lines) or "no server to stop"

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {
            "stopped": self.stopped,
            "kept": self.kept,
            "left_behind": self.left_behind,
            "skipped": self.skipped,
        }


class StopError(RuntimeError):
    """Some servers this run should have stopped still run; ``report`` says which and why."""

    def __init__(self, message: str, report: StopReport) -> None:
        super().__init__(message)
        self.report = report
