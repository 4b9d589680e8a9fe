"""The servers a shard runs against: which take work now, which rest, which are gone.

A server that is alive but misbehaving never loses its in-flight work; only a server that is
gone does. The states (in rotation, resting, ejected) and every move between them are pure
decisions in ``include.engine.server_states``; the pool feeds them what it observes
(request results, ``/health`` probes, the time) and carries out what they decide: it logs,
cancels an ejected server's in-flight requests so the engine sends them elsewhere, and wakes
the dispatcher when a server's room changes.

With ``concurrency_mode: adaptive`` each server's in-flight window follows its own queue
(how: ``include.engine.window.next_window``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from include.engine import server_states as st
from include.engine.server_states import PROBES_TO_EJECT, ServerHealth
from include.engine.window import next_window, parse_metrics
from include.outcomes import ErrorKind, ServerStatus
from include.sglang import aio
from include.sglang.contract import (
    Failure,
    health_probe_timeout_s,
    served_model,
    server_version,
    unauthorized_cause,
)

__all__ = ["PROBES_TO_EJECT", "ServerPool", "ServerState", "unauthorized_cause"]

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """One server as the engine sees it: its counters, and its rest state (``health``)."""

    url: str
    window: int
    in_flight: int = 0
    context_length: int | None = None
    model: str | None = None
    #: SGLang's version as ``/server_info`` reports it (None: not reported).
    version: str | None = None
    completed: int = 0
    output_tokens: int = 0
    sent: int = 0
    metrics_available: bool = True
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _health: ServerHealth = field(default_factory=ServerHealth, repr=False)
    #: True whenever the server is not plainly in rotation (resting or ejected): ``free``
    #: then looks closer; the common case costs one attribute read.
    limited: bool = False

    @property
    def health(self) -> ServerHealth:
        """Return the rest state (``server_states.ServerHealth``)."""
        return self._health

    @health.setter
    def health(self, value: ServerHealth) -> None:
        self._health = value
        self.limited = value.limited

    @property
    def free(self) -> int:
        """Return how many more requests this server may take now."""
        if not self.limited:
            return self.window - self.in_flight
        return self._health.free(self.window, self.in_flight, time.monotonic())

    @property
    def state(self) -> str:
        """Return ``in rotation``, ``resting`` or ``ejected`` (for logs and stats)."""
        return self._health.state

    # Read-only views of the rest state, under the names logs and stats use.
    healthy = property(lambda self: self._health.healthy)
    cooling = property(lambda self: self._health.cooling)
    consecutive_failures = property(lambda self: self._health.consecutive_failures)
    cool_until = property(lambda self: self._health.cool_until)
    cool_level = property(lambda self: self._health.cool_level)
    trial = property(lambda self: self._health.trial)
    failed_probes = property(lambda self: self._health.failed_probes)
    ejections = property(lambda self: self._health.ejections)
    cool_downs = property(lambda self: self._health.cool_downs)
    ejected_reason = property(lambda self: self._health.ejected_reason)


class ServerPool:
    """Server states plus the background health and concurrency loops."""

    def __init__(
        self,
        urls: list[str],
        *,
        mode: str,
        start_window: int,
        min_window: int,
        max_window: int,
        cool_down_after_failures: int,
        health_interval_s: float,
        headers: dict[str, str] | None = None,
        metrics_interval_s: float = 1.0,
        changed: asyncio.Event | None = None,
        cool_down_s: float = 5.0,
        cool_down_max_s: float = 30.0,
        sglang_conn_id: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no servers: set server_urls or gpu_hosts")
        self.mode = mode
        self.min_window = min_window
        self.max_window = max_window
        self.policy = st.Policy(cool_down_after_failures, cool_down_s, cool_down_max_s)
        self.health_interval_s = health_interval_s
        self.metrics_interval_s = metrics_interval_s
        self.headers = headers or {}
        #: The Airflow connection whose password is the servers' API key (for messages).
        self.sglang_conn_id = sglang_conn_id
        window = start_window if mode == "fixed" else max(min_window, min(start_window, max_window))
        self.servers = [ServerState(url.rstrip("/"), window) for url in urls]
        #: Set whenever a server's room changes (rests, ejected, re-admitted, new window).
        self.changed = changed or asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- selection ---------------------------------------------------------------------
    def pick(self) -> ServerState | None:
        """Return the server with the most free room, or None if none can take a request."""
        best = None
        best_free = 0
        for server in self.servers:
            free = server.free
            if free > best_free:
                best, best_free = server, free
        return best

    def dispatched(self, server: ServerState) -> int:
        """Count a request sent to ``server`` (after a cool-down it is the one trial); return
        its sequence number on that server, for ``record_success``."""
        server.in_flight += 1
        server.sent += 1
        if server.limited:
            server.health = st.dispatched(server.health, server.sent)
        return server.sent

    def healthy_count(self) -> int:
        """Return how many servers are in rotation (neither resting nor ejected)."""
        return sum(not s.limited for s in self.servers)

    def state_counts(self) -> dict[str, int]:
        """Return how many servers are in rotation, resting and ejected."""
        counts = dict.fromkeys(map(str, ServerStatus), 0)
        for server in self.servers:
            counts[str(server.state)] += 1
        return counts

    def stats(self) -> list[dict[str, Any]]:
        """Return each server's counters and final window (the shard's outcome)."""
        return [
            {"url": s.url, "model": s.model, "context_length": s.context_length,
             "completed": s.completed, "output_tokens": s.output_tokens, "sent": s.sent,
             "ejections": s.ejections, "cool_downs": s.cool_downs, "healthy": s.healthy,
             "final_window": s.window}
            for s in self.servers
        ]

    # --- outcomes ------------------------------------------------------------------------
    def record_success(self, server: ServerState, output_tokens: int, seq: int) -> None:
        """Count a completed request (``seq`` from ``dispatched``); it may end a rest."""
        server.completed += 1
        server.output_tokens += output_tokens
        self._apply(server, st.request_succeeded(server.health, seq))

    def record_failure(self, server: ServerState, kind: str, message: str, prompt_id: str,
                       seq: int) -> bool:
        """Count a retryable failure (``seq`` from ``dispatched``); return whether it counts
        against the prompt (``server_states.request_failed`` decides)."""
        refused = kind == ErrorKind.CONNECT
        step = st.request_failed(
            server.health, self.policy, prompt_id=prompt_id, seq=seq, sent=server.sent,
            now=time.monotonic(), failure=message if refused else f"{kind} {message[:200]}",
            refused=refused,
        )  # fmt: skip
        self._apply(server, step)
        return step.charged

    def eject(self, server: ServerState, reason: str) -> None:
        """Take a gone server out of rotation and cancel its in-flight requests for re-dispatch."""
        self._apply(server, st.eject(server.health, reason))

    def readmit(self, server: ServerState) -> None:
        """Put an ejected server back in rotation (its /health answered 200)."""
        self._apply(server, st.readmitted(server.health))

    def probe_result(self, server: ServerState, ok: bool, gone: bool, detail: str) -> None:
        """Apply one health probe's result (``gone``: the connection was refused)."""
        self._apply(server, st.probed(server.health, self.policy, ok=ok, refused=gone,
                                      detail=detail))

    def _apply(self, server: ServerState, step: st.Step) -> None:
        """Carry out a decision: the new state, then its effects."""
        if step.state is not server.health:
            server.health = step.state
        action = step.action
        if not action:
            return
        if action == st.REST:
            log.warning("server %s rests %.1fs (%s); its %d in-flight requests run on",
                        server.url, step.rest_s, step.reason, server.in_flight)
            # Wake the dispatcher when the trial may go, not a polling interval later.
            try:
                asyncio.get_running_loop().call_later(step.rest_s, self.changed.set)
            except RuntimeError:
                pass  # no loop (a unit test driving the pool by hand): nobody waits to be woken
            return
        if action == st.EJECT:
            log.warning("server %s ejected: %s; re-dispatching its %d in-flight requests",
                        server.url, step.reason, len(server.tasks))
            for task in list(server.tasks):
                task.cancel()
        elif action == st.READMIT:
            if self.mode == "adaptive":
                server.window = max(self.min_window, min(server.window, self.max_window))
            log.warning("server %s %s", server.url, step.reason)
        elif action == st.PROBE_REST:
            log.warning("server %s: %s; no new requests until a probe passes, its %d "
                        "in-flight requests run on", server.url, step.reason, server.in_flight)
            return  # the dispatcher finds the server full; nothing to wake it for
        else:  # BACK, PROBE_PASSED
            log.warning("server %s %s", server.url, step.reason)
        self.changed.set()

    # --- background loops ----------------------------------------------------------------
    async def discover(self, session: aiohttp.ClientSession) -> None:
        """Read each server's model and context length from ``/v1/models``."""
        async def one(server: ServerState) -> None:
            answer = await aio.models(session, server.url, self.headers, timeout=10)
            if answer.status == 401:
                raise PermissionError(
                    f"server {server.url} answered 401 Unauthorized to /v1/models: "
                    f"{unauthorized_cause(self.sglang_conn_id)}"
                )
            try:
                if not answer.answered:
                    raise answer.error or ConnectionError(answer.failure)
                entry = served_model(answer.json())
            except (TimeoutError, OSError, aiohttp.ClientError, ValueError, LookupError,
                    TypeError) as exc:
                server.health = st.unreachable_at_start(
                    server.health, f"unreachable at start ({type(exc).__name__})")
                log.warning("server %s unreachable at start (%s); the health monitor will "
                            "re-admit it when /health is 200", server.url, exc)
                return
            server.model, server.context_length = entry.id, entry.max_model_len
            # Recorded in every row it answers (provenance, the dataset card); informative:
            # a server that does not say is no problem.
            info = await aio.server_info(session, server.url, self.headers, timeout=10)
            if info.status == 200:
                try:
                    server.version = server_version(info.json())
                except ValueError:
                    pass

        await asyncio.gather(*(one(s) for s in self.servers))

    def start(self, session: aiohttp.ClientSession) -> None:
        """Start the health monitor (and the window controller in adaptive mode)."""
        self._tasks.append(asyncio.create_task(self._health_loop(session)))
        if self.mode == "adaptive":
            self._tasks.append(asyncio.create_task(self._metrics_loop(session)))

    async def stop(self) -> None:
        """Stop the background loops."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def probe_timeout_s(self) -> float:
        """Return how long one health probe may take (SGLang's /health takes 1 s or more)."""
        return health_probe_timeout_s(min(10.0, 2 * self.health_interval_s))

    async def _health_loop(self, session: aiohttp.ClientSession) -> None:
        timeout = self.probe_timeout_s()
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(session, s, timeout) for s in self.servers))

    async def _check(self, session: aiohttp.ClientSession, server: ServerState,
                     timeout: float) -> None:
        answer = await aio.health(session, server.url, timeout)
        gone = False
        if answer.answered:
            ok, detail = answer.status == 200, f"/health answered {answer.status}"
        elif answer.failure == Failure.CONNECT:
            os_error = getattr(answer.error, "os_error", answer.error)
            ok, gone, detail = False, True, f"/health refused the connection ({os_error})"
        else:
            ok, detail = False, f"/health failed ({type(answer.error).__name__})"
        self.probe_result(server, ok, gone, detail)

    async def _metrics_loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.gather(*(self._adapt(session, s) for s in self.servers
                                   if s.healthy and s.metrics_available))
            await asyncio.sleep(self.metrics_interval_s)

    async def _adapt(self, session: aiohttp.ClientSession, server: ServerState) -> None:
        answer = await aio.metrics(session, server.url, timeout=5)
        if not answer.answered:
            return  # the health loop owns ejection; a missed sample just skips one step
        if answer.status != 200:
            server.metrics_available = False
            log.warning(
                "server %s has no /metrics (HTTP %d); its window stays at %d. Start "
                "servers with --enable-metrics for adaptive concurrency.",
                server.url, answer.status, server.window,
            )
            return
        metrics = parse_metrics(answer.text())
        queue = metrics.get("sglang:num_queue_reqs")
        running = metrics.get("sglang:num_running_reqs")
        if queue is None or running is None:
            return
        new = next_window(server.window, server.in_flight, queue, running,
                          self.min_window, self.max_window)
        if new != server.window:
            server.window = new
            self.changed.set()
