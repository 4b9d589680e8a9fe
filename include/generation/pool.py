"""The servers a shard runs against: which take work now, which rest, which are gone.

A server that is alive but misbehaving never loses its in-flight work; only a server that is
gone does. Three states:

* **in rotation**: takes requests up to its in-flight window.
* **resting**: it answered ``cool_down_after_failures`` retryable failures in a row (5xx, timeout,
  dropped connection, full queue), or its last health probe failed (timeout or not 200). It
  gets no new requests while its in-flight ones run on. After a failure streak it rests for
  a cool-down (``cool_down_s``, doubled for each cool-down in a row, at most
  ``cool_down_max_s``), then takes one trial request; any success puts it back in rotation.
  After a failed probe it rests until a probe passes.
* **ejected**: it is gone: it refused a connection, or failed ``PROBES_TO_EJECT`` health
  probes in a row. Its in-flight requests are cancelled so the engine sends them elsewhere,
  and it is re-admitted when ``/health`` answers 200 again.

With ``concurrency_mode: adaptive`` each server's in-flight window follows its own queue
(``sglang:num_queue_reqs`` from ``/metrics``): it grows while the server's queue is empty and
the window is full, and shrinks when requests pile up in the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from include.generation.client import CONNECT
from include.generation.window import next_window, parse_metrics
from include.sglang_health import health_probe_timeout_s

log = logging.getLogger(__name__)

#: Health probes failed in a row (timeout or not 200) after which a server counts as gone.
#: One failed probe only rests it: a loaded host can miss one without losing its work.
PROBES_TO_EJECT = 3


def unauthorized_cause(sglang_conn_id: str | None = None) -> str:
    """Return why a server answers 401, naming the connection holding the run's API key."""
    conn = (f"Airflow connection {sglang_conn_id!r} (REGEN_SGLANG_CONN_ID)" if sglang_conn_id
            else "the Airflow connection named by REGEN_SGLANG_CONN_ID")
    return (f"it was started with another API key than the password of {conn}; set that "
            "password to the servers' key, or relaunch the servers with it")


@dataclass
class ServerState:
    """One server as the engine sees it."""

    url: str
    window: int
    #: False once ejected (gone), until /health is 200 again.
    healthy: bool = True
    in_flight: int = 0
    consecutive_failures: int = 0
    context_length: int | None = None
    model: str | None = None
    ejections: int = 0
    ejected_reason: str = ""
    completed: int = 0
    output_tokens: int = 0
    sent: int = 0
    cool_downs: int = 0
    metrics_available: bool = True
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: True whenever the server is not plainly in rotation (resting or ejected): ``free``
    #: then looks closer; the common case costs one attribute read.
    limited: bool = False
    cool_until: float = 0.0
    cool_level: int = 0
    #: ``sent`` when the cool-down began: only a request sent after it can end it.
    cool_from: int = 0
    #: ``sent`` of the trial request in flight after a cool-down (0: none).
    trial: int = 0
    failed_probes: int = 0
    #: The first prompt of the current failure streak, and whether the streak holds others.
    streak_prompt: str | None = None
    streak_mixed: bool = False
    #: ``sent`` when the current failure streak began: only a request sent after it can end
    #: it, as for a cool-down.
    streak_from: int = 0

    @property
    def free(self) -> int:
        """Return how many more requests this server may take now."""
        if not self.limited:
            return self.window - self.in_flight
        if not self.healthy or self.failed_probes or self.trial:
            return 0
        return 1 if time.monotonic() >= self.cool_until else 0

    @property
    def cooling(self) -> bool:
        """Return whether a failure streak has put the server in a cool-down."""
        return self.cool_until > 0.0

    @property
    def state(self) -> str:
        """Return ``in rotation``, ``resting`` or ``ejected`` (for logs and stats)."""
        if not self.healthy:
            return "ejected"
        return "resting" if self.limited else "in rotation"

    def _update_limited(self) -> None:
        self.limited = not self.healthy or bool(self.failed_probes) or self.cooling


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
        self.cool_down_after_failures = cool_down_after_failures
        self.cool_down_s = cool_down_s
        self.cool_down_max_s = cool_down_max_s
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
            server.trial = server.sent
        return server.sent

    def healthy_count(self) -> int:
        """Return how many servers are in rotation (neither resting nor ejected)."""
        return sum(not s.limited for s in self.servers)

    def state_counts(self) -> dict[str, int]:
        """Return how many servers are in rotation, resting and ejected."""
        counts = {"in rotation": 0, "resting": 0, "ejected": 0}
        for server in self.servers:
            counts[server.state] += 1
        return counts

    # --- outcomes ------------------------------------------------------------------------
    def record_success(self, server: ServerState, output_tokens: int, seq: int) -> None:
        """Count a completed request (``seq`` from ``dispatched``).

        A request sent after its server's failure streak (or cool-down) began ends it; one
        sent before proves nothing about now: a brownout starts with old requests still
        finishing, and letting them end the streak would make each next failure the first
        of a new streak, charged to its prompt.
        """
        if seq > server.streak_from:
            server.consecutive_failures = 0
        server.completed += 1
        server.output_tokens += output_tokens
        if server.cooling and seq > server.cool_from:
            server.cool_until = 0.0
            server.cool_level = 0
            server.trial = 0
            server._update_limited()
            log.warning("server %s answered again: back in rotation after its cool-down",
                        server.url)
            self.changed.set()

    def record_failure(self, server: ServerState, kind: str, message: str, prompt_id: str,
                       seq: int) -> bool:
        """Count a retryable failure (``seq`` from ``dispatched``); return whether it counts
        against the prompt.

        It does only when the server was working for others: not resting, not on its trial
        request, and not already failing other prompts (a brownout is the server's fault,
        a prompt that fails alone is the prompt's). Connection refused ejects the server;
        a failure streak rests it.
        """
        if kind == CONNECT:
            self.eject(server, f"connection refused ({message})")
            return False
        charged = not server.limited
        if server.consecutive_failures == 0:
            server.streak_prompt, server.streak_mixed = prompt_id, False
            server.streak_from = server.sent
        elif prompt_id != server.streak_prompt:
            server.streak_mixed = True
        server.consecutive_failures += 1
        charged = charged and not server.streak_mixed
        was_trial = seq == server.trial
        if was_trial:
            server.trial = 0
        if server.healthy and (
            was_trial
            or (not server.cooling and server.consecutive_failures >= self.cool_down_after_failures)
        ):
            what = ("its trial request failed" if was_trial else
                    f"{server.consecutive_failures} failures in a row, last")
            self._cool(server, f"{what}: {kind} {message[:200]}")
        return charged

    def _cool(self, server: ServerState, reason: str) -> None:
        pause = min(self.cool_down_max_s, self.cool_down_s * 2 ** server.cool_level)
        server.cool_level += 1
        server.cool_downs += 1
        server.cool_until = time.monotonic() + pause
        server.cool_from = server.sent
        server._update_limited()
        log.warning("server %s rests %.1fs (%s); its %d in-flight requests run on",
                    server.url, pause, reason, server.in_flight)
        # Wake the dispatcher when the trial may go, not a polling interval later.
        try:
            asyncio.get_running_loop().call_later(pause, self.changed.set)
        except RuntimeError:
            pass  # no loop (a unit test driving the pool by hand): nobody waits to be woken

    def eject(self, server: ServerState, reason: str) -> None:
        """Take a gone server out of rotation and cancel its in-flight requests for re-dispatch."""
        if not server.healthy:
            return
        server.healthy = False
        server._update_limited()
        server.ejections += 1
        server.ejected_reason = reason
        log.warning(
            "server %s ejected: %s; re-dispatching its %d in-flight requests",
            server.url, reason, len(server.tasks),
        )
        for task in list(server.tasks):
            task.cancel()
        self.changed.set()

    def readmit(self, server: ServerState) -> None:
        """Put an ejected server back in rotation (its /health answered 200)."""
        server.healthy = True
        server.consecutive_failures = 0
        server.failed_probes = 0
        server.cool_until, server.cool_level, server.trial = 0.0, 0, 0
        server._update_limited()
        if self.mode == "adaptive":
            server.window = max(self.min_window, min(server.window, self.max_window))
        log.warning("server %s re-admitted: /health is 200 again", server.url)
        self.changed.set()

    def probe_result(self, server: ServerState, ok: bool, gone: bool, detail: str) -> None:
        """Apply one health probe's result (``gone``: the connection was refused)."""
        if ok:
            if not server.healthy:
                self.readmit(server)
            elif server.failed_probes:
                server.failed_probes = 0
                server._update_limited()
                log.warning("server %s passes its health probe again", server.url)
                self.changed.set()
            return
        if not server.healthy:
            return
        server.failed_probes += 1
        if gone or server.failed_probes >= PROBES_TO_EJECT:
            self.eject(server, detail if gone else
                       f"{server.failed_probes} health probes failed in a row, last: {detail}")
        elif server.failed_probes == 1:
            server._update_limited()
            log.warning("server %s: %s; no new requests until a probe passes, its %d "
                        "in-flight requests run on", server.url, detail, server.in_flight)

    # --- background loops ----------------------------------------------------------------
    async def discover(self, session: aiohttp.ClientSession) -> None:
        """Read each server's model and context length from ``/v1/models``."""
        async def one(server: ServerState) -> None:
            try:
                async with session.get(
                    server.url + "/v1/models", headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    if resp.status == 401:
                        raise PermissionError(
                            f"server {server.url} answered 401 Unauthorized to /v1/models: "
                            f"{unauthorized_cause(self.sglang_conn_id)}"
                        )
                    data = await resp.json(content_type=None)
                entry = data["data"][0]
                server.model = entry.get("id")
                server.context_length = entry.get("max_model_len")
            except PermissionError:
                raise
            except (TimeoutError, aiohttp.ClientError, ValueError, LookupError, TypeError) as exc:
                server.healthy = False
                server._update_limited()
                server.ejected_reason = f"unreachable at start ({type(exc).__name__})"
                log.warning("server %s unreachable at start (%s); the health monitor will "
                            "re-admit it when /health is 200", server.url, exc)

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
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s())
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(session, s, timeout) for s in self.servers))

    async def _check(
        self, session: aiohttp.ClientSession, server: ServerState, timeout: aiohttp.ClientTimeout
    ) -> None:
        gone = False
        try:
            async with session.get(server.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
                await resp.read()
                detail = f"/health answered {resp.status}"
        except aiohttp.ClientConnectorError as exc:
            ok, gone, detail = False, True, f"/health refused the connection ({exc.os_error})"
        except (TimeoutError, aiohttp.ClientError) as exc:
            ok, detail = False, f"/health failed ({type(exc).__name__})"
        self.probe_result(server, ok, gone, detail)

    async def _metrics_loop(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=5)
        while True:
            await asyncio.gather(*(self._adapt(session, s, timeout) for s in self.servers
                                   if s.healthy and s.metrics_available))
            await asyncio.sleep(self.metrics_interval_s)

    async def _adapt(
        self, session: aiohttp.ClientSession, server: ServerState, timeout: aiohttp.ClientTimeout
    ) -> None:
        try:
            async with session.get(server.url + "/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    server.metrics_available = False
                    log.warning(
                        "server %s has no /metrics (HTTP %d); its window stays at %d. Start "
                        "servers with --enable-metrics for adaptive concurrency.",
                        server.url, resp.status, server.window,
                    )
                    return
                metrics = parse_metrics(await resp.text())
        except (TimeoutError, aiohttp.ClientError):
            return  # the health loop owns ejection; a missed sample just skips one step
        queue = metrics.get("sglang:num_queue_reqs")
        running = metrics.get("sglang:num_running_reqs")
        if queue is None or running is None:
            return
        new = next_window(server.window, server.in_flight, queue, running,
                          self.min_window, self.max_window)
        if new != server.window:
            server.window = new
            self.changed.set()
