"""Drive the performance model (`perf.BatchScheduler`) in real time on the asyncio loop."""

from __future__ import annotations

import asyncio

from sglang_standin import perf
from sglang_standin.metrics import Metrics

# SGLang's decode log interval: last_gen_throughput is refreshed every this many steps.
THROUGHPUT_WINDOW_STEPS = 40


class SchedulerLoop:
    """Drive a BatchScheduler in real time with one asyncio task.

    Steps run back to back until the scheduler clock is ahead of the wall clock, then the task
    sleeps; finished jobs are resolved after that sleep, so answers arrive when the model says.
    """

    def __init__(self, model: perf.PerfModel, max_queued: int | None, metrics: Metrics) -> None:
        self.sched = perf.BatchScheduler(model, max_queued)
        self.metrics = metrics
        self.last_gen_throughput = 0.0
        self._wake = asyncio.Event()
        self._origin = 0.0  # wall time (loop clock) matching scheduler clock 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="standin-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, job: perf.Job) -> asyncio.Future[perf.Job]:
        """Queue `job` (QueueFullError propagates) and return a future resolved when it ends."""
        self.sched.submit(job)
        fut: asyncio.Future[perf.Job] = asyncio.get_running_loop().create_future()
        job.payload = fut
        self._wake.set()
        return fut

    def cancel(self, job: perf.Job) -> None:
        self.sched.cancel(job)

    def ttft_seconds(self, job: perf.Job, arrived: float) -> float:
        """Return the wall-clock time to first token of a finished job that arrived at `arrived`."""
        assert job.first_token_at is not None
        return max(0.0, self._origin + job.first_token_at - arrived)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.sched
        window_tokens, window_steps, window_start = 0, 0, loop.time()
        while True:
            if sched.idle:
                self._wake.clear()
                await self._wake.wait()
                # Re-anchor after idling so a burst does not "catch up" on time nobody used.
                self._origin = loop.time() - sched.clock
                window_tokens, window_steps, window_start = 0, 0, loop.time()
            done: list[perf.Job] = []
            for _ in range(256):
                if sched.idle:
                    break
                result = sched.step()
                window_tokens += result.batch
                window_steps += 1
                self.metrics.generation_tokens_total += result.batch
                done.extend(result.finished)
                if self._origin + sched.clock - loop.time() > 0.002:
                    break
            delay = self._origin + sched.clock - loop.time()
            await asyncio.sleep(max(0.0, delay))
            for job in done:
                fut = job.payload
                if isinstance(fut, asyncio.Future) and not fut.done():
                    fut.set_result(job)
            if window_steps >= THROUGHPUT_WINDOW_STEPS:
                elapsed = loop.time() - window_start
                if elapsed > 0:
                    self.last_gen_throughput = window_tokens / elapsed
                window_tokens, window_steps, window_start = 0, 0, loop.time()
