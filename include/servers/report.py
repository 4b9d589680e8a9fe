"""What launching and stopping a run's servers did, as JSON data for XCom.

``LaunchReport`` records, per server, what the launch did and whether this run started it and
holds a lease on it, so teardown (``stop_servers``) releases exactly this run's leases and
stops only servers no other run leases. It holds no secret: the health gate gets the name of
the connection holding the API key (``sglang_conn_id``) and reads the key itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from include.servers.checks import ModelExpectation
from include.servers.commands import ServerSpec

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
        """Return JSON-ready data; ``from_dict`` inverts it."""
        return {
            "server": self.server.to_dict(),
            "action": self.action,
            "started_by_this_run": self.started_by_this_run,
            "pid": self.pid,
            "detail": self.detail,
            "differences": list(self.differences),
            "leased": self.leased,
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
    connection whose password is the servers' API key.
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
    def urls(self) -> list[str]:
        """Return the URLs of the servers for this run: started, replaced, reused, loading."""
        return [s.server.url for s in self.servers if s.action not in ("mismatched", "failed")]

    def health_targets(self) -> list[dict[str, Any]]:
        """Return one ``ServerHealthSensor`` kwargs dict per server (for ``expand_kwargs``)."""
        return [
            {
                "server": s.server.to_dict(),
                "expected": self.expected.to_dict(),
                "timeout_s": self.launch_timeout_s,
                "sglang_conn_id": self.sglang_conn_id,
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
            "sglang_conn_id": self.sglang_conn_id,
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
            sglang_conn_id=data.get("sglang_conn_id"),
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
