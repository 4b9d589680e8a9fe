"""What the launcher reads of a server before and between its decisions, as plain data.

``launcher.py`` fills these from ``GET /v1/models``, ``/server_info`` and the status, acquire
and launch commands' output; ``decisions.py`` reads them. No SSH, no HTTP here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from include.servers.commands import parse_fields


@dataclass(frozen=True)
class ServerProcess:
    """One server's process as its host's files record it: pid, alive, who started it, leases.

    Not ``include.outcomes.ServerStatus`` (a server's state in the engine's pool): this is
    what a status, acquire or launch command read from the pid, owner and lease files.
    """

    pid: int | None
    alive: bool
    owner: str
    leases: int = 0

    @classmethod
    def parse(cls, output: str) -> ServerProcess:
        """Read the fields a status, acquire or launch command printed."""
        fields = parse_fields(output)
        pid = fields.get("pid") or ""
        leases = fields.get("leases") or "0"
        return cls(
            int(pid) if pid.isdigit() else None,
            fields.get("alive") == "1",
            fields.get("owner", ""),
            int(leases) if leases.isdigit() else 0,
        )

    def owned_by(self, owner: str | None) -> bool:
        """Return whether run ``owner`` started this server (a retried launch finds its own)."""
        return bool(owner) and self.owner == owner


@dataclass(frozen=True)
class ModelsProbe:
    """Hold one ``GET /v1/models`` outcome: ``answering`` False means nothing listens."""

    answering: bool
    status: int | None = None
    body: Any = None
    error: str = ""


@dataclass(frozen=True)
class Observation:
    """What is there before a launch touches a server: its port's answers, its process."""

    probe: ModelsProbe
    #: ``/server_info``'s JSON, read only from a port answering 200 (None otherwise).
    server_info: Any
    process: ServerProcess
