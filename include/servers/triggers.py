"""Wait in the triggerer until one SGLang server is healthy and serves the run's model.

``ServerHealthTrigger`` polls ``/health`` (connection refused and 503 mean "not yet": SGLang
opens its port only once the model is loaded, then answers 503 while it warms up) until
200 or an absolute deadline, then checks ``/v1/models`` with ``served_model_differences``, and
yields one ``TriggerEvent``. While waiting it checks now and then, over SSH or locally, that
the server's process (from its pid file) is still alive: a server that exited fails at once,
and every failure carries the tail of the server's log. The triggerer imports this module by
the classpath ``serialize()`` returns, so it must stay importable from ``include/``.

The API key is never among the trigger's arguments (they are stored in Airflow's database):
the trigger gets the name of the connection holding it and reads the connection when it runs,
and it redacts the key from the log tails it puts in its events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from airflow.triggers.base import BaseTrigger, TriggerEvent

from include.servers.commands import ServerSpec, build_log_tail_command, parse_fields, redact
from include.servers.expectations import ModelExpectation, served_model_differences
from include.servers.hosts import run_once_on_host
from include.servers.lifecycle import build_status_command
from include.sglang import aio
from include.sglang.contract import Failure, bearer, health_probe_timeout_s

__all__ = ["ServerHealthTrigger"]

log = logging.getLogger(__name__)


async def run_host_command(spec: ServerSpec, command: str, timeout: float = 30.0) -> str:
    """Run ``hosts.run_once_on_host`` in a worker thread, so the triggerer's loop keeps
    serving other triggers; return stdout (HostError naming the host when it fails)."""
    return await asyncio.to_thread(run_once_on_host, spec, command, timeout=timeout)


class ServerHealthTrigger(BaseTrigger):
    """Fire once when a server is healthy and checked, or when it failed or ran out of time.

    :param server: ``ServerSpec.to_dict()`` of the server (URL, host, SSH connection, paths):
        the deployment's own spec, matched by the sensor (``trusted_spec``). It is a trigger
        argument, stored in Airflow's database, which users cannot edit as they can XCom.
    :param expected: ``ModelExpectation.to_dict()``: model name, context length, token budget.
    :param deadline: Absolute time (epoch seconds) after which waiting fails; absolute so a
        triggerer restart does not extend it.
    :param sglang_conn_id: Airflow connection whose password is the servers' API key, the
        Bearer key for ``/v1/models`` (``/health`` needs none); None means no key.
    :param poke_interval: Seconds between ``/health`` polls.
    :param process_check_interval: Seconds between checks that the server process lives;
        each costs one SSH command. 0 disables the check.
    :param log_tail_lines: Lines of the server log included in a failure.

    The event payload is ``{"status": "success"|"error", "server", "url", "message",
    "models", "elapsed_s"}``.
    """

    def __init__(
        self,
        *,
        server: dict[str, Any],
        expected: dict[str, Any],
        deadline: float,
        sglang_conn_id: str | None = None,
        poke_interval: float = 5.0,
        process_check_interval: float = 15.0,
        log_tail_lines: int = 60,
        started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.server = dict(server)
        self.expected = dict(expected)
        self.deadline = float(deadline)
        self.sglang_conn_id = sglang_conn_id
        self.poke_interval = float(poke_interval)
        self.process_check_interval = float(process_check_interval)
        self.log_tail_lines = int(log_tail_lines)
        self.started_at = float(started_at if started_at is not None else time.time())
        self._spec = ServerSpec.from_dict(self.server)
        self._expectation = ModelExpectation.from_dict(self.expected)
        self._last_health = "no answer yet"
        self._api_key: str | None = None
        self._api_key_read = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return this class's import path and its keyword arguments."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "server": self.server,
                "expected": self.expected,
                "deadline": self.deadline,
                "sglang_conn_id": self.sglang_conn_id,
                "poke_interval": self.poke_interval,
                "process_check_interval": self.process_check_interval,
                "log_tail_lines": self.log_tail_lines,
                "started_at": self.started_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until healthy, exited or past the deadline; yield exactly one event."""
        next_process_check = 0.0  # check at the first poll that is not healthy
        async with aiohttp.ClientSession() as session:
            while True:
                check_process = (
                    self.process_check_interval > 0 and time.monotonic() >= next_process_check
                )
                result = await self.check_once(session, check_process=check_process)
                if check_process:
                    next_process_check = time.monotonic() + self.process_check_interval
                if result["status"] != "waiting":
                    yield TriggerEvent(result)
                    return
                await asyncio.sleep(max(0.0, min(self.poke_interval, self.deadline - time.time())))

    async def check_once(
        self, session: aiohttp.ClientSession, *, check_process: bool = False
    ) -> dict[str, Any]:
        """Check the server once; return an event payload whose status may be ``waiting``."""
        spec = self._spec
        status = await self._health(session)
        if status == 200:
            return await self._check_models(session)
        if time.time() >= self.deadline:
            waited = time.time() - self.started_at
            return await self._error(
                f"not healthy after {waited:.0f} s (/health: {self._last_health}); if the model "
                "needs longer to load raise setting `launch_timeout_s`, else see the log"
            )
        if check_process:
            try:
                out = await run_host_command(spec, build_status_command(spec.paths))
            except Exception as exc:  # the HTTP poll still decides; only log a broken check
                log.warning("server %s: cannot check its process: %s", spec.name, exc)
            else:
                fields = parse_fields(out)
                if fields.get("pid") and fields.get("alive") == "0":
                    return await self._error(
                        f"its process {fields['pid']} (pid file {spec.paths.pid_file}) exited "
                        f"before /health answered 200 (/health: {self._last_health})"
                    )
        return self._payload("waiting", f"/health: {self._last_health}")

    def health_timeout_s(self) -> float:
        """Return how long one ``/health`` poll may take: SGLang's takes 1 s or more."""
        return health_probe_timeout_s(min(10.0, self.poke_interval * 2))

    async def _health(self, session: aiohttp.ClientSession) -> int | None:
        answer = await aio.health(session, self._spec.url, self.health_timeout_s())
        if answer.answered:
            self._last_health = f"HTTP {answer.status}"
            return answer.status
        if answer.failure == Failure.CONNECT and answer.refused:
            # A live SGLang process keeps its port closed while it loads the model.
            self._last_health = "connection refused (the port opens once the model is loaded)"
        else:
            self._last_health = type(answer.error).__name__
        return None

    async def api_key(self) -> str | None:
        """Return the API key, read from its connection on first use."""
        if not self._api_key_read:
            from include.sglang.hook import SGLangHook

            self._api_key = await SGLangHook(self.sglang_conn_id).async_api_key()
            self._api_key_read = True
        return self._api_key

    async def _check_models(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        key = await self.api_key()
        answer = await aio.models(session, self._spec.url, bearer(key), timeout=30)
        if not answer.answered:
            return self._payload("error", f"/v1/models failed after /health 200: {answer.error!r}")
        if answer.status == 401:
            return self._payload(
                "error",
                "/v1/models answered 401 Unauthorized: the server was started with "
                "another API key than the password of Airflow connection "
                f"{self.sglang_conn_id!r} (REGEN_SGLANG_CONN_ID)",
            )
        if answer.status != 200:
            return self._payload("error",
                                 f"/v1/models answered {answer.status}: {answer.text()[:300]}")
        try:
            models = answer.json()
        except ValueError as exc:
            return self._payload("error", f"/v1/models failed after /health 200: {exc!r}")
        problems = served_model_differences(models, self._expectation)
        if problems:
            return self._payload("error", "; ".join(problems), models=models)
        return self._payload("success", "healthy and serving the run's model", models=models)

    async def _error(self, reason: str) -> dict[str, Any]:
        spec = self._spec
        try:
            tail = await run_host_command(
                spec, build_log_tail_command(spec.paths.log_file, self.log_tail_lines)
            )
            # SGLang logs its arguments, API key included.
            tail = redact(tail.rstrip(), await self.api_key()) or "(empty or missing)"
        except Exception as exc:
            tail = f"(could not read it: {exc})"
        return self._payload(
            "error",
            f"{reason}\n--- last {self.log_tail_lines} lines of {spec.paths.log_file} on "
            f"{spec.host} ---\n{tail}",
        )

    def _payload(
        self,
        status: str,
        message: str,
        *,
        models: Any = None,
    ) -> dict[str, Any]:
        return {
            "status": status,
            "server": self._spec.name,
            "url": self._spec.url,
            "message": message,
            "models": models,
            "elapsed_s": round(time.time() - self.started_at, 3),
        }
