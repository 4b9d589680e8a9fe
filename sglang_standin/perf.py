"""Model the stand-in's batching performance as pure, clock-free Python.

`BatchScheduler.step()` advances every running request by one token in one shared decode step
and returns how long that step would take; the server's asyncio loop sleeps for it, tests and
benchmarks can call it directly in virtual time. Shape: step_s = (base + per_req * batch +
prefill_per_token * new uncached prompt tokens) * time_scale, so output throughput
batch / step_s rises with batch size toward a ceiling set by `max_running_requests`, and
requests whose KV reservation does not fit in `max_total_num_tokens` wait in the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

# Defaults give ~190 tok/s at 4 in flight, ~980 at 32 and a ~1400 tok/s ceiling at 64, the
# shape (not the magnitude) of a 27B model on one GPU; --standin-time-scale shrinks all times.
DEFAULT_DECODE_BASE_S = 0.020
DEFAULT_DECODE_PER_REQ_S = 0.0004
DEFAULT_PREFILL_PER_TOKEN_S = 0.00002
DEFAULT_MAX_RUNNING_REQUESTS = 64
DEFAULT_MAX_TOTAL_NUM_TOKENS = 262_144


@dataclass(frozen=True)
class PerfModel:
    """Hold the knobs of the performance model; all times in seconds before `time_scale`."""

    decode_base_s: float = DEFAULT_DECODE_BASE_S
    decode_per_req_s: float = DEFAULT_DECODE_PER_REQ_S
    prefill_per_token_s: float = DEFAULT_PREFILL_PER_TOKEN_S
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    max_total_num_tokens: int = DEFAULT_MAX_TOTAL_NUM_TOKENS
    time_scale: float = 1.0

    def step_seconds(self, batch: int, prefill_tokens: int = 0) -> float:
        """Return the wall time of one step decoding `batch` requests plus `prefill_tokens`."""
        raw = (
            self.decode_base_s
            + self.decode_per_req_s * batch
            + self.prefill_per_token_s * prefill_tokens
        )
        return raw * self.time_scale

    def gen_throughput(self, batch: int) -> float:
        """Return steady-state output tokens/s with `batch` requests decoding (capped at max)."""
        batch = min(batch, self.max_running_requests)
        if batch <= 0:
            return 0.0
        return batch / self.step_seconds(batch)


def ceiling_gen_throughput(model: PerfModel | None = None) -> float:
    """Return the theoretical output tokens/s at a full batch (prefill and KV limits ignored).

    A client can approach it only with at least `max_running_requests` requests in flight whose
    KV reservations fit in `max_total_num_tokens` together.
    """
    model = model or PerfModel()
    return model.gen_throughput(model.max_running_requests)


@dataclass
class Job:
    """Hold one request's scheduling state; `payload` is opaque to the scheduler."""

    prompt_tokens: int
    output_tokens: int
    payload: object = None
    # Prompt tokens found in the radix cache: their prefill is skipped, as SGLang skips it.
    cached_tokens: int = 0
    generated: int = 0
    # Time (scheduler clock) when the job got its first token / finished; set by step().
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def kv_reservation(self) -> int:
        # The stand-in knows each output length up front, so it reserves exactly what the request
        # will use and never has to retract a running request as SGLang sometimes does.
        return self.prompt_tokens + self.output_tokens


@dataclass
class StepResult:
    """Say what one scheduler step did."""

    duration_s: float
    batch: int
    prefill_tokens: int
    admitted: list[Job] = field(default_factory=list)
    finished: list[Job] = field(default_factory=list)


class QueueFullError(Exception):
    """Raised by `BatchScheduler.submit` when `max_queued_requests` waiting jobs already exist."""


class BatchScheduler:
    """Run the continuous-batching model: FIFO admission, one shared decode step per call.

    Admission is first-come-first-served with head-of-line blocking, like SGLang's default
    policy: the queue head waits until a running slot and its KV reservation are both free.
    """

    def __init__(self, model: PerfModel, max_queued_requests: int | None = None) -> None:
        self.model = model
        self.max_queued_requests = max_queued_requests
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.kv_used = 0
        self.clock = 0.0
        self.generated_tokens_total = 0

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def submit(self, job: Job) -> None:
        """Queue `job`; raise QueueFullError when the waiting queue is at its cap."""
        if (
            self.max_queued_requests is not None
            and len(self.waiting) + 1 > self.max_queued_requests
        ):
            raise QueueFullError("The request queue is full.")
        if job.output_tokens <= 0:
            raise ValueError("a job must generate at least one token")
        self.waiting.append(job)

    def cancel(self, job: Job) -> bool:
        """Drop `job` wherever it is (a client went away) and free its KV; say if it was found."""
        if job in self.running:
            self.running.remove(job)
            self.kv_used -= _clamped_reservation(job, self.model)
            return True
        try:
            self.waiting.remove(job)
        except ValueError:
            return False
        return True

    def step(self) -> StepResult:
        """Admit what fits, decode one token for every running job, advance the clock."""
        admitted = self._admit()
        prefill = sum(job.prompt_tokens - job.cached_tokens for job in admitted)
        batch = len(self.running)
        duration = self.model.step_seconds(batch, prefill) if batch else 0.0
        self.clock += duration
        finished: list[Job] = []
        still_running: list[Job] = []
        for job in self.running:
            job.generated += 1
            if job.first_token_at is None:
                job.first_token_at = self.clock
            if job.generated >= job.output_tokens:
                job.finished_at = self.clock
                self.kv_used -= _clamped_reservation(job, self.model)
                finished.append(job)
            else:
                still_running.append(job)
        self.running = still_running
        self.generated_tokens_total += batch
        return StepResult(duration, batch, prefill, admitted, finished)

    def _admit(self) -> list[Job]:
        admitted: list[Job] = []
        while self.waiting and len(self.running) < self.model.max_running_requests:
            need = _clamped_reservation(self.waiting[0], self.model)
            if self.kv_used + need > self.model.max_total_num_tokens:
                break
            job = self.waiting.popleft()
            self.kv_used += need
            self.running.append(job)
            admitted.append(job)
        return admitted


def _clamped_reservation(job: Job, model: PerfModel) -> int:
    # A request larger than the whole cache would wait forever; admit it alone instead.
    return min(job.kv_reservation, model.max_total_num_tokens)


def simulate_closed_loop(
    model: PerfModel,
    in_flight: int,
    lengths: Iterable[tuple[int, int]],
) -> tuple[int, float]:
    """Run a closed-loop client keeping `in_flight` jobs submitted; return (tokens, seconds).

    `lengths` yields (prompt_tokens, output_tokens) per job; the run ends when it is exhausted
    and every job finished. Used by tests and benchmarks to predict throughput without sockets.
    """
    sched = BatchScheduler(model)
    source = iter(lengths)
    outstanding = 0
    exhausted = False
    while True:
        while not exhausted and outstanding < in_flight:
            try:
                prompt, output = next(source)
            except StopIteration:
                exhausted = True
                break
            sched.submit(Job(prompt, output))
            outstanding += 1
        if sched.idle:
            break
        outstanding -= len(sched.step().finished)
    return sched.generated_tokens_total, sched.clock
