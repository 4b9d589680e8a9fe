"""Gate a run on one SGLang server being healthy and serving the run's model.

``ServerHealthSensor`` is shaped like Airflow's ``HttpSensor``: deferrable by default, it
checks once in the worker and, if the server is not ready yet, defers to
``ServerHealthTrigger`` in the triggerer; ``execute_complete`` turns an error event into a
task failure whose message names the server and includes its log tail. With
``deferrable=False`` the same checks run in the worker (handy for ``airflow dags test`` and
for tests).

The API key is read at run time, in the worker or the triggerer, from the Airflow connection
named by ``sglang_conn_id``; it is never a task argument, an XCom value or a trigger argument.

One sensor per server, mapped over ``LaunchReport.health_targets()``::

    ServerHealthSensor.partial(task_id="wait_for_server").expand_kwargs(launch["health_targets"])
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import aiohttp
from airflow.sdk import BaseSensorOperator

from include.servers.commands import ServerSpec
from include.servers.triggers import ServerHealthTrigger


class ServerNotReadyError(RuntimeError):
    """A server failed its health gate; the message names it, says why and what to change."""


class ServerHealthSensor(BaseSensorOperator):
    """Wait until one server's ``/health`` is 200 and its ``/v1/models`` fits the run.

    A server the launcher started, and one it found loading (another run's, or this run's
    before a retry), are waited for alike: up to ``timeout_s``, failing at once if the
    process exits; the model name and context length are checked once it answers.

    :param server: ``ServerSpec.to_dict()`` (an entry of ``LaunchReport.health_targets()``).
    :param expected: ``ModelExpectation.to_dict()`` the served model is checked against.
    :param timeout_s: Longest wait for the server to load (setting ``launch_timeout_s``).
    :param sglang_conn_id: Airflow connection whose password is the servers' API key (the
        Bearer key for ``/v1/models``), read when the check runs; None means no key.
    :param deferrable: Wait in the triggerer (default) or in the worker.
    :param process_check_interval: Seconds between checks (over SSH) that the process lives.
    """

    template_fields = ("server", "expected", "timeout_s")

    def __init__(
        self,
        *,
        server: dict[str, Any],
        expected: dict[str, Any],
        timeout_s: float = 1800.0,
        sglang_conn_id: str | None = None,
        deferrable: bool = True,
        poke_interval: float = 5.0,
        process_check_interval: float = 15.0,
        log_tail_lines: int = 60,
        **kwargs: Any,
    ) -> None:
        # The trigger's own deadline decides; Airflow's timeout is a backstop a bit later.
        kwargs.setdefault("timeout", float(timeout_s) + 120.0)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.server = server
        self.expected = expected
        self.timeout_s = timeout_s
        self.sglang_conn_id = sglang_conn_id
        self.deferrable = deferrable
        self.process_check_interval = process_check_interval
        self.log_tail_lines = log_tail_lines

    def _trigger(self) -> ServerHealthTrigger:
        now = time.time()
        return ServerHealthTrigger(
            server=self.server,
            expected=self.expected,
            deadline=now + float(self.timeout_s),
            sglang_conn_id=self.sglang_conn_id,
            poke_interval=self.poke_interval,
            process_check_interval=self.process_check_interval,
            log_tail_lines=self.log_tail_lines,
            started_at=now,
        )

    def poke(self, context: Any) -> bool:
        """Check the server once: True when ready, False while loading; raise on failure."""
        payload = asyncio.run(_check_once(self._trigger(), check_process=True))
        if payload["status"] == "waiting":
            self.log.info("server %s: %s", payload["server"], payload["message"])
            return False
        self.execute_complete(context, payload)
        return True

    def execute(self, context: Any) -> dict[str, Any]:
        """Return the check result when ready; defer (or wait here) while the server loads."""
        trigger = self._trigger()
        if not self.deferrable:
            payload = asyncio.run(_first_event(trigger))
            return self.execute_complete(context, payload)
        payload = asyncio.run(_check_once(trigger, check_process=False))
        if payload["status"] != "waiting":
            return self.execute_complete(context, payload)
        self.log.info(
            "server %s not ready (%s); deferring for up to %.0f s",
            payload["server"], payload["message"], float(self.timeout_s),
        )  # fmt: skip
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout_s) + 120.0),
        )
        raise AssertionError("unreachable: defer() raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the event payload on success; raise ServerNotReadyError on any other event."""
        name = ServerSpec.from_dict(self.server).name
        if not event:
            raise ServerNotReadyError(f"server {name}: the health trigger returned no event")
        if event.get("status") != "success":
            raise ServerNotReadyError(
                f"server {event.get('server', name)} ({event.get('url')}) is not ready: "
                f"{event.get('message')}"
            )
        self.log.info("server %s: %s", event.get("server", name), event.get("message"))
        return event


async def _check_once(trigger: ServerHealthTrigger, *, check_process: bool) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        return await trigger.check_once(session, check_process=check_process)


async def _first_event(trigger: ServerHealthTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise ServerNotReadyError("the health trigger ended without an event")
