"""Conversation affinity: which server takes a conversation's next turn.

A turn goes to the server that answered the conversation's previous turn: its radix cache
holds the history, so only the new turns cost prefill. It moves when that server cannot
serve it well: resting or ejected (``engine.pool`` states), gone from the pool, or far
busier than the least-loaded server in rotation (its window load, in-flight / window, above
the least-loaded one's by more than ``busier_by``). A first turn goes to the least-loaded
server. Each move carries its reason, for the counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from include.outcomes import ServerStatus


class Placement(StrEnum):
    """Why a turn goes where it goes: the last four are moves away from its previous server."""

    FIRST_TURN = "first_turn"
    KEPT = "kept"
    NO_SERVER = "no_server"
    RESTING = "resting"
    EJECTED = "ejected"
    GONE = "gone"
    BUSIER = "busier"


@dataclass(frozen=True)
class ServerView:
    """What affinity needs of one server (``engine.pool.ServerState``): its url, state,
    in-flight requests, window and free room."""

    url: str
    state: ServerStatus
    in_flight: int
    window: int
    free: int

    @property
    def load(self) -> float:
        """Return the share of its window in use (a zero window counts as full)."""
        return self.in_flight / self.window if self.window > 0 else 1.0


@dataclass(frozen=True)
class Choice:
    """Where the turn goes: ``url`` None when no server is in rotation; ``ready`` whether it
    has room now (else the turn waits for it); ``moved`` and ``reason`` for the counters."""

    url: str | None
    moved: bool
    reason: Placement
    ready: bool = False


def choose_server(
    previous: str | None, servers: Sequence[ServerView], *, busier_by: float = 0.5
) -> Choice:
    """Return the server for a conversation's next turn (see the module docstring).

    ``previous``: the url that answered its previous turn (None for a first turn).
    ``busier_by``: how far above the least-loaded server's window load the previous server
    may be and keep the turn (0.5: half a window); waiting for a busy server that holds the
    history is often cheaper than prefilling it again elsewhere.
    """
    if busier_by < 0:
        raise ValueError(f"busier_by must be >= 0, got {busier_by}")
    rotation = [s for s in servers if s.state == ServerStatus.IN_ROTATION]
    if not rotation:
        return Choice(None, False, Placement.NO_SERVER)
    # Least loaded first; among equals the one with the most room, then by url (stable).
    best = min(rotation, key=lambda s: (s.load, -s.free, s.url))
    if previous is None:
        return Choice(best.url, False, Placement.FIRST_TURN, best.free > 0)
    home = next((s for s in servers if s.url == previous), None)
    if home is None:
        reason = Placement.GONE
    elif home.state == ServerStatus.IN_ROTATION and home.load - best.load <= busier_by:
        return Choice(home.url, False, Placement.KEPT, home.free > 0)
    elif home.state == ServerStatus.IN_ROTATION:
        reason = Placement.BUSIER
    else:
        reason = (Placement.EJECTED if home.state == ServerStatus.EJECTED
                  else Placement.RESTING)
    return Choice(best.url, True, reason, best.free > 0)
