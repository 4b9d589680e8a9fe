"""The servers a shard runs against: health, ejection, re-admission and in-flight windows.

A background monitor polls every server's ``/health``; a server that refuses a connection or
fails ``eject_after_failures`` requests in a row is ejected at once, its in-flight requests
are cancelled so the engine sends them elsewhere, and it is re-admitted when ``/health``
answers 200 again. With ``concurrency_mode: adaptive`` each server's in-flight window follows
its own queue (``sglang:num_queue_reqs`` from ``/metrics``): it grows while the server's queue
is empty and the window is full, and shrinks when requests pile up in the queue.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

_METRIC_RE = re.compile(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+\-]+|NaN)\s*$", re.M)


def parse_metrics(text: str) -> dict[str, float]:
    """Return the unlabelled-sum of every ``sglang:*`` gauge/counter in Prometheus text."""
    out: dict[str, float] = {}
    for name, value in _METRIC_RE.findall(text):
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


@dataclass
class ServerState:
    """One server as the engine sees it."""

    url: str
    window: int
    healthy: bool = True
    in_flight: int = 0
    consecutive_failures: int = 0
    context_length: int | None = None
    model: str | None = None
    ejections: int = 0
    ejected_reason: str = ""
    completed: int = 0
    output_tokens: int = 0
    metrics_available: bool = True
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def free(self) -> int:
        """Return how many more requests this server may take now."""
        return self.window - self.in_flight if self.healthy else 0


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
        eject_after_failures: int,
        health_interval_s: float,
        headers: dict[str, str] | None = None,
        metrics_interval_s: float = 1.0,
        changed: asyncio.Event | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no servers: set server_urls or gpu_hosts")
        self.mode = mode
        self.min_window = min_window
        self.max_window = max_window
        self.eject_after_failures = eject_after_failures
        self.health_interval_s = health_interval_s
        self.metrics_interval_s = metrics_interval_s
        self.headers = headers or {}
        window = start_window if mode == "fixed" else max(min_window, min(start_window, max_window))
        self.servers = [ServerState(url.rstrip("/"), window) for url in urls]
        #: Set whenever a server's room changes (ejected, re-admitted, new window).
        self.changed = changed or asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- selection ---------------------------------------------------------------------
    def pick(self) -> ServerState | None:
        """Return the healthy server with the most free room, or None if all are full."""
        best = None
        best_free = 0
        for server in self.servers:
            free = server.free
            if free > best_free:
                best, best_free = server, free
        return best

    def healthy_count(self) -> int:
        """Return how many servers are in rotation."""
        return sum(s.healthy for s in self.servers)

    # --- outcomes ------------------------------------------------------------------------
    def record_success(self, server: ServerState, output_tokens: int) -> None:
        """Count a completed request."""
        server.consecutive_failures = 0
        server.completed += 1
        server.output_tokens += output_tokens

    def record_failure(self, server: ServerState, kind: str, message: str) -> None:
        """Count a retryable failure; eject the server if it looks down."""
        from include.generation.client import CONNECT, QUEUE_FULL

        if kind == QUEUE_FULL:
            return  # a full queue is load, not a fault: back off, keep the server and its work
        server.consecutive_failures += 1
        if kind == CONNECT:
            self.eject(server, f"connection refused ({message})")
        elif server.consecutive_failures >= self.eject_after_failures:
            self.eject(server, f"{server.consecutive_failures} failures in a row, last: {message}")

    def eject(self, server: ServerState, reason: str) -> None:
        """Take a server out of rotation and cancel its in-flight requests for re-dispatch."""
        if not server.healthy:
            return
        server.healthy = False
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
        """Put a server back in rotation (its /health answered 200)."""
        server.healthy = True
        server.consecutive_failures = 0
        if self.mode == "adaptive":
            server.window = max(self.min_window, min(server.window, self.max_window))
        log.warning("server %s re-admitted: /health is 200 again", server.url)
        self.changed.set()

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
                            "the api_key setting does not match the server's --api-key"
                        )
                    data = await resp.json(content_type=None)
                entry = data["data"][0]
                server.model = entry.get("id")
                server.context_length = entry.get("max_model_len")
            except PermissionError:
                raise
            except (TimeoutError, aiohttp.ClientError, ValueError, LookupError, TypeError) as exc:
                server.healthy = False
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

    async def _health_loop(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=max(2.0, min(10.0, 2 * self.health_interval_s)))
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(session, s, timeout) for s in self.servers))

    async def _check(
        self, session: aiohttp.ClientSession, server: ServerState, timeout: aiohttp.ClientTimeout
    ) -> None:
        try:
            async with session.get(server.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
                await resp.read()
                detail = f"/health answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            ok, detail = False, f"/health failed ({type(exc).__name__})"
        if ok and not server.healthy:
            self.readmit(server)
        elif not ok and server.healthy:
            self.eject(server, detail)

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


def next_window(
    window: int, in_flight: int, queue: float, running: float, low: int, high: int
) -> int:
    """Return the next in-flight window for a server from its queue and batch sizes.

    The aim is a short, never-empty queue: the batch stays full (a finished request is
    replaced from the queue at once) without requests waiting for minutes. While the queue is
    empty and this client uses its window, the server has room: grow by half (slow start).
    With a short queue below target, grow by a quarter; when the queue is well above target,
    shrink by half the excess, weighted by this client's share of what the server holds (the
    other clients sharing it, e.g. other shards in flight, shrink by theirs).
    """
    target = max(2.0, running / 16)
    if queue < 1 and in_flight >= 0.9 * window:
        window = window + max(2, window // 2)
    elif queue < target and in_flight >= 0.9 * window:
        window = window + max(2, window // 4)
    elif queue > 3 * target:
        # Several clients (shards in flight) may share this server and all see the same
        # queue: each takes back only its share of the excess, or together they overshoot.
        share = in_flight / max(running + queue, in_flight, 1.0)
        window = window - max(1, int((queue - target) * share / 2))
    return max(low, min(high, window))
