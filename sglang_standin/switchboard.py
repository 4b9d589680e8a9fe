"""A stand-in whose faults a file on its host switches on and off while it runs.

The deployment tier starts its servers through the DAG's launcher, with flags fixed for the
whole deployment, so a scenario cannot give one run's servers a fault flag. Here every server
of the host watches one JSON file (``--standin-fault-file``, re-read within
``POLL_S``); a scenario writes it (``write_faults``) and the servers follow:

* ``"hold_health": true`` — ``/health`` answers 503, as while a model loads: the launcher's
  health gate keeps waiting (deferred in the triggerer) until the file says otherwise;
* ``"brownout_until": <unix time>`` — until then, ``/v1/chat/completions`` and ``/generate``
  answer 503 with SGLang's "queue is full" envelope at once; ``/health`` stays 200 (alive,
  only failing);
* ``"time_scale": <float>`` — the performance model's ``--standin-time-scale`` from now on
  (slower "GPUs" stretch a shard so a fault lands in it); absent: the command line's.

It also counts what a benchmark of the deployment needs from the servers themselves, in
``/metrics`` (with ``--enable-metrics``): ``standin:busy_seconds_total``, wall seconds with at
least one request queued or running; ``standin:first_busy_timestamp_seconds`` and
``standin:last_busy_timestamp_seconds`` (Unix time; the last is now while busy; 0 before the
first request); ``standin:brownout_rejected_total``; ``process_start_time_seconds``.

Everything else is ``python -m sglang_standin``: ``python -m sglang_standin.switchboard
--standin-fault-file FILE [its flags]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from sglang_standin import perf
from sglang_standin.cli import ServerConfig, parse_args
from sglang_standin.server import (
    QUEUE_FULL_TEXT,
    StandinServer,
    configure_logging,
    flat_error,
    serve,
)

logger = logging.getLogger("sglang_standin")

#: How often the fault file is checked for changes (seconds).
POLL_S = 0.2
GENERATION_PATHS = ("/v1/chat/completions", "/generate")


def write_faults(path: str | os.PathLike[str], **faults: Any) -> None:
    """Replace the fault file with ``faults`` in one step (a server never reads half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, path)


class TimedScheduler(perf.BatchScheduler):
    """A BatchScheduler that also measures, in wall time, how long it has work."""

    def __init__(self, model: perf.PerfModel, max_queued_requests: int | None = None) -> None:
        super().__init__(model, max_queued_requests)
        self.busy_s = 0.0
        self.first_busy_at = 0.0  # Unix time
        self.last_busy_at = 0.0
        self._since: float | None = None  # monotonic start of the current busy stretch

    def submit(self, job: perf.Job) -> None:
        super().submit(job)
        self._mark()

    def cancel(self, job: perf.Job) -> bool:
        found = super().cancel(job)
        self._mark()
        return found

    def step(self) -> perf.StepResult:
        result = super().step()
        self._mark()
        return result

    def _mark(self) -> None:
        now = time.monotonic()
        if self.idle and self._since is not None:
            self.busy_s += now - self._since
            self._since = None
            self.last_busy_at = time.time()
        elif not self.idle and self._since is None:
            self._since = now
            if not self.first_busy_at:
                self.first_busy_at = time.time()

    def busy_seconds(self) -> float:
        extra = time.monotonic() - self._since if self._since is not None else 0.0
        return self.busy_s + extra

    def last_busy(self) -> float:
        return time.time() if self._since is not None else self.last_busy_at


class SwitchboardServer(StandinServer):
    """A StandinServer that follows a fault file and counts its busy time."""

    def __init__(self, config: ServerConfig, fault_file: str | None,
                 tokenizer: Any | None = None) -> None:
        self.fault_file = Path(fault_file) if fault_file else None
        self.faults: dict[str, Any] = {}
        self.brownout_rejected = 0
        self.started_at = time.time()
        self._seen: tuple[int, int, int] | None = None
        super().__init__(config, tokenizer=tokenizer)
        self.base_model = self.model
        self.timed = TimedScheduler(self.model, config.max_queued_requests)
        self.scheduler.sched = self.timed

    async def start(self) -> None:
        self._read_faults()
        await super().start()
        if self.fault_file is not None:
            self._background.append(asyncio.get_running_loop().create_task(self._watch()))

    def _build_app(self) -> web.Application:
        app = super()._build_app()
        app.middlewares.append(self._fault_middleware)
        return app

    @web.middleware
    async def _fault_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/health") and self.faults.get("hold_health"):
            return web.Response(status=503)
        if request.method == "POST" and request.path in GENERATION_PATHS and \
                time.time() < self.faults.get("brownout_until", 0.0):
            self.brownout_rejected += 1
            return flat_error(QUEUE_FULL_TEXT, "503", 503)
        return await handler(request)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        base = await super().metrics_endpoint(request)
        # Prometheus label escaping (backslash, quote, newline) is JSON's for these.
        label = f'model_name="{json.dumps(self.served_name)[1:-1]}"'
        extra = [
            ("standin:busy_seconds_total", "counter",
             "Wall seconds with at least one request queued or running.",
             self.timed.busy_seconds()),
            ("standin:first_busy_timestamp_seconds", "gauge",
             "Unix time of the first request (0: none yet).", self.timed.first_busy_at),
            ("standin:last_busy_timestamp_seconds", "gauge",
             "Unix time the server last had work (now while busy).", self.timed.last_busy()),
            ("standin:brownout_rejected_total", "counter",
             "Generation requests answered 503 by a brownout.", self.brownout_rejected),
            ("process_start_time_seconds", "gauge", "Unix time the process started.",
             self.started_at),
        ]
        lines = []
        for name, kind, help_text, value in extra:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                      f"{name}{{{label}}} {float(value)!r}"]
        return web.Response(text=base.text + "\n".join(lines) + "\n", content_type="text/plain",
                            charset="utf-8")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self._read_faults()

    def _read_faults(self) -> None:
        """Apply the fault file when it changed; keep the faults in force if it is unreadable."""
        if self.fault_file is None:
            return
        try:
            st = self.fault_file.stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._seen:
            return
        try:
            faults = parse_faults(self.fault_file.read_text()) if stamp else {}
        except (OSError, ValueError) as exc:
            logger.warning("stand-in: fault file %s not applied (%s); faults unchanged",
                           self.fault_file, exc)
            return
        self._seen = stamp
        if faults != self.faults:
            logger.info("stand-in fault file %s: %s", self.fault_file, faults or "no faults")
        self.faults = faults
        scale = faults.get("time_scale")
        self.timed.model = (dataclasses.replace(self.base_model, time_scale=scale)
                            if scale else self.base_model)


def parse_faults(text: str) -> dict[str, Any]:
    """Return the faults a fault file holds; raise ValueError naming what is wrong."""
    data = json.loads(text or "{}")
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object of faults is needed, not {type(data).__name__}")
    unknown = sorted(set(data) - {"hold_health", "brownout_until", "time_scale"})
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: hold_health, brownout_until, "
                         "time_scale")
    out: dict[str, Any] = {}
    if data.get("hold_health"):
        out["hold_health"] = True
    if data.get("brownout_until") is not None:
        out["brownout_until"] = float(data["brownout_until"])
    if data.get("time_scale") is not None:
        out["time_scale"] = float(data["time_scale"])
        if out["time_scale"] <= 0:
            raise ValueError(f"time_scale must be above 0, got {data['time_scale']}")
    return out


def _own_flags(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--standin-fault-file", default=None)
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m sglang_standin.switchboard``."""
    own, rest = _own_flags(argv)
    config = parse_args(rest)
    configure_logging(config.log_level)
    if not os.path.isdir(config.effective_tokenizer_path):
        logger.error("stand-in: tokenizer path %s is not a local directory",
                     config.effective_tokenizer_path)
        raise SystemExit(2)
    logger.info("stand-in with a fault file: %s", own.standin_fault_file or "(none)")
    asyncio.run(serve(config, SwitchboardServer(config, own.standin_fault_file)))


if __name__ == "__main__":
    main()
