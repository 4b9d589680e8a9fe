"""Faults the stand-in has no flag for, in front of real stand-ins: a brownout, a slow /health.

Each ``FaultProxy`` (an aiohttp server on its own thread and loop) forwards everything to one
stand-in process, except that:

* while the shared ``Brownout`` is on, chat completions answer 503 at once (SGLang's "queue
  is full" envelope, or a plain 503). ``/health`` keeps answering 200: the servers are
  alive, only failing. The brownout starts after ``after_requests`` completions were
  forwarded in all, so it lands mid-shard, and lasts ``seconds``;
* ``/health`` answers after ``health_delay_s`` (a loaded host), so a probe is nearly always
  in flight: a client whose event loop stalls for longer than the probe timeout fails it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
from aiohttp import web

from sglang_standin.process import free_port

#: The two 503 bodies: SGLang's full queue (its only 503 on this route), and a plain one.
QUEUE_FULL = {"object": "error", "message": "The request queue is full.", "type": "503",
              "param": None, "code": 503}
UNAVAILABLE = {"object": "error", "message": "Service Unavailable", "type":
               "ServiceUnavailableError", "param": None, "code": 503}
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class Brownout:
    """When the servers behind the proxies fail, and how many requests each way."""

    def __init__(self, after_requests: int, seconds: float,
                 body: dict | None = None) -> None:
        self.after_requests = after_requests
        self.seconds = seconds
        self.body = body or QUEUE_FULL
        self.forwarded = 0
        self.rejected = 0
        self.until: float | None = None
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Return whether a completion may go through now (and count it either way)."""
        with self._lock:
            now = time.monotonic()
            if self.until is None and self.forwarded >= self.after_requests:
                self.until = now + self.seconds
            if self.until is not None and now < self.until:
                self.rejected += 1
                return False
            self.forwarded += 1
            return True


class FaultProxy:
    """One stand-in behind a proxy with these faults; ``url`` is where to send."""

    def __init__(self, upstream: str, brownout: Brownout | None = None,
                 health_delay_s: float = 0.0) -> None:
        self.upstream = upstream
        self.brownout = brownout
        self.health_delay_s = health_delay_s
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if (request.path == "/v1/chat/completions" and self.brownout is not None
                and not self.brownout.admit()):
            return web.json_response(self.brownout.body, status=503)
        if request.path == "/health" and self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         data=await request.read(), headers=headers) as resp:
            body = await resp.read()
            return web.Response(body=body, status=resp.status,
                                content_type=resp.content_type or "application/json")
