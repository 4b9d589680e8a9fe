"""Gate a run on one SGLang server being healthy and serving the run's model.

``ServerHealthSensor`` is shaped like Airflow's ``HttpSensor``: deferrable by default, it
checks once in the worker and, if the server is not ready yet, defers to
``ServerHealthTrigger`` (``include.servers.triggers``); ``execute_complete`` turns an error
event into a task failure naming the server, with its log tail. ``deferrable=False`` runs the
same checks in the worker (``airflow dags test``, tests).

Its one mapped argument, ``server``, is an identifier from XCom; the server itself, the model it
must serve, the launch timeout and the key's connection are rebuilt from the run's params (why:
``include.servers.launch_report``'s docstring; the key: ``include.sglang.hook``'s)::

    ServerHealthSensor.partial(task_id="wait_for_server").expand(server=targets)
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from include.servers.expectations import ModelExpectation
from include.servers.launch_report import ident_address, trusted_spec

if TYPE_CHECKING:
    from include.servers.triggers import ServerHealthTrigger
    from include.settings import RunSettings

#: Airflow's own timeout of a deferred gate, beyond ``launch_timeout_s``: the trigger's
#: deadline decides, this is a backstop.
BACKSTOP_S = 120.0


class ServerNotReadyError(RuntimeError):
    """A server failed its health gate; the message names it, says why and what to change."""


class ServerHealthSensor(BaseSensorOperator):
    """Wait until one server's ``/health`` is 200 and its ``/v1/models`` fits the run.

    A server the launcher started, and one it found loading (another run's, or this run's
    before a retry), are waited for alike: up to setting ``launch_timeout_s``, failing at once
    if the process exits; the model name and context length are checked once it answers.

    :param server: The server's identifier, ``{"host", "port"}`` (an entry of
        ``LaunchReport.health_targets()``); one the deployment does not list fails the gate
        (XComMismatchError) before any probe.
    :param settings: The run's settings, for tests that build a deployment in-process; None
        (in a DAG) rebuilds them when the sensor runs from ``context["params"]`` and the
        deployment settings of the environment.
    :param deferrable: Wait in the triggerer (default) or in the worker.
    :param process_check_interval: Seconds between checks (over SSH) that the process lives.
    """

    # Nothing is rendered: `server` comes from XCom and is matched, never templated.
    template_fields = ()

    def __init__(
        self,
        *,
        server: dict[str, Any] | str,
        settings: RunSettings | None = None,
        deferrable: bool = True,
        poke_interval: float = 5.0,
        process_check_interval: float = 15.0,
        log_tail_lines: int = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.server = server
        self.settings = settings
        self.deferrable = deferrable
        self.process_check_interval = process_check_interval
        self.log_tail_lines = log_tail_lines

    def _settings(self, context: Any) -> RunSettings:
        from include.settings import RunSettings

        if self.settings is not None:
            if not isinstance(self.settings, RunSettings):  # never data, e.g. from XCom
                raise TypeError(f"settings must be RunSettings, not {type(self.settings)}")
            return self.settings
        params = context.get("params") if hasattr(context, "get") else None
        if params is None:
            raise ServerNotReadyError(
                f"server {ident_address(self.server)}: no run params in the task context to "
                "rebuild the run's settings from (run it in a DAG, or pass settings=)"
            )
        return RunSettings.from_mapping(params)

    def _trigger(self, context: Any) -> ServerHealthTrigger:
        """Return the trigger for the deployment's own server, with the settings' checks."""
        # Imported when the sensor runs, not when the DAG file is parsed: the trigger brings
        # aiohttp and the SSH hooks, and the triggerer imports it by its classpath anyway.
        from include.servers.triggers import ServerHealthTrigger

        settings = self._settings(context)
        spec = trusted_spec(self.server, settings)
        timeout_s = float(settings.launch_timeout_s)
        self.timeout = timeout_s + BACKSTOP_S
        now = time.time()
        return ServerHealthTrigger(
            server=spec.to_dict(),
            expected=ModelExpectation.from_settings(settings).to_dict(),
            deadline=now + timeout_s,
            sglang_conn_id=settings.deployment.sglang_conn_id,
            poke_interval=self.poke_interval,
            process_check_interval=self.process_check_interval,
            log_tail_lines=self.log_tail_lines,
            started_at=now,
        )

    def poke(self, context: Any) -> bool:
        """Check the server once: True when ready, False while loading; raise on failure."""
        payload = asyncio.run(_check_once(self._trigger(context), check_process=True))
        if payload["status"] == "waiting":
            self.log.info("server %s: %s", payload["server"], payload["message"])
            return False
        self.execute_complete(context, payload)
        return True

    def execute(self, context: Any) -> dict[str, Any]:
        """Return the check result when ready; defer (or wait here) while the server loads."""
        trigger = self._trigger(context)
        if not self.deferrable:
            payload = asyncio.run(_first_event(trigger))
            return self.execute_complete(context, payload)
        payload = asyncio.run(_check_once(trigger, check_process=False))
        if payload["status"] != "waiting":
            return self.execute_complete(context, payload)
        wait_s = trigger.deadline - trigger.started_at
        self.log.info(
            "server %s not ready (%s); deferring for up to %.0f s",
            payload["server"], payload["message"], wait_s,
        )  # fmt: skip
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=wait_s + BACKSTOP_S),
        )
        raise AssertionError("unreachable: defer() raises")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the event payload on success; raise ServerNotReadyError on any other event."""
        name = ident_address(self.server)
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
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await trigger.check_once(session, check_process=check_process)


async def _first_event(trigger: ServerHealthTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise ServerNotReadyError("the health trigger ended without an event")
