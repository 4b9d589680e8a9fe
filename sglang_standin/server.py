"""Serve SGLang's HTTP contract from a CPU-only asyncio process (a test double, not a server).

One `StandinServer` owns an aiohttp app, one `SchedulerLoop` (a single task advancing every
running request per decode step), the tokenizer and the fault-injection state. Error texts and
envelopes are copied byte for byte from SGLang (see /work/shared/docs/sglang-contract.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from sglang_standin import perf
from sglang_standin.cli import ServerConfig, parse_args
from sglang_standin.generation import Completion, CompletionWriter, LengthModel, split_reasoning
from sglang_standin.metrics import Metrics

logger = logging.getLogger("sglang_standin")

READY_LINE = "The server is fired up and ready to roll!"
CRASH_EXIT_CODE = 1
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
QUEUE_FULL_TEXT = "The request queue is full."
VERSION_STRINGS = {"v0.5.6": "0.5.6", "head": "0.5.6+head"}
# SGLang's decode log interval: last_gen_throughput is refreshed every this many steps.
THROUGHPUT_WINDOW_STEPS = 40
_PROMPT_CACHE_SIZE = 512


class BadRequest(Exception):
    """A request the real server rejects with 400.

    `validation` marks body errors, which SGLang's RequestValidationError handler types
    "Bad Request"; other 400s come from its OpenAI layer typed "BadRequestError".
    """

    def __init__(self, message: str, *, validation: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.validation = validation


def _error_type(exc: BadRequest) -> str:
    return "Bad Request" if exc.validation else "BadRequestError"


def json_response(data: Any, status: int = 200) -> web.Response:
    """Return compact JSON like FastAPI's ORJSONResponse (no spaces, UTF-8 kept raw)."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return web.Response(body=body.encode(), status=status, content_type="application/json")


def flat_error(message: str, err_type: str, code: int) -> web.Response:
    """Return SGLang's flat /v1 error envelope (its ErrorResponse, not OpenAI's nested one)."""
    return json_response(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": code},
        status=code,
    )


def length_error(
    prompt_tokens: int,
    max_new_tokens: int | None,
    context_length: int,
    max_req_input_len: int,
    mode: str,
) -> str | None:
    """Return SGLang's 400 message for a prompt/max_tokens that does not fit, else None.

    Order as in SGLang: the tokenizer manager's two checks, then the scheduler's input check.
    `mode` "v0.5.6" rejects P + M >= C, "head" rejects P + M > C.
    """
    p, c = prompt_tokens, context_length
    if p >= c:
        return f"The input ({p} tokens) is longer than the model's context length ({c} tokens)."
    if max_new_tokens is not None:
        total = p + max_new_tokens
        if total > c or (mode == "v0.5.6" and total == c):
            return (
                f"Requested token count exceeds the model's maximum context length of {c} tokens."
                f" You requested a total of {total} tokens: {p} tokens from the input messages"
                f" and {max_new_tokens} tokens for the completion. Please reduce the number of"
                " tokens in the input messages or the completion to fit within the limit."
            )
    if p >= max_req_input_len:
        return (
            f"Input length ({p} tokens) exceeds the maximum allowed length "
            f"({max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
        )
    return None


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


class StandinServer:
    """Hold the app, tokenizer, scheduler and fault state of one stand-in server."""

    def __init__(self, config: ServerConfig, tokenizer: Any | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        self.chat_template: str | None = None
        if config.chat_template:
            self.chat_template = self._load_chat_template(config.chat_template)
        self.context_length = config.resolve_context_length()
        self.model = config.perf_model()
        kv = self.model.max_total_num_tokens
        self.max_req_input_len = min(self.context_length - 1, kv - 1) - 5
        self.served_name = config.effective_served_model_name
        self.writer = CompletionWriter(
            self.tokenizer,
            seed=config.seed,
            lengths=LengthModel(
                config.median_output_tokens, config.output_sigma, config.max_output_tokens
            ),
        )
        self.metrics = Metrics(self.served_name)
        self.scheduler = SchedulerLoop(self.model, config.max_queued_requests, self.metrics)
        self.ready = asyncio.Event()
        self.hung = False
        self.arrivals = 0
        self._fault_rng = random.Random(config.seed ^ 0x5EED_FA17)
        self._prompt_cache: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self._background: list[asyncio.Task[None]] = []
        self.app = self._build_app()

    # ----- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the port, then warm up in the background (health is 503 until then)."""
        self._runner = web.AppRunner(
            self.app,
            keepalive_timeout=5.0,  # SGLang (uvicorn) closes idle keep-alive connections at ~5 s
            handler_cancellation=True,  # a client that goes away aborts its request, as in SGLang
            access_log=None,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.config.host, self.config.port, backlog=2048, reuse_address=True
        )
        await site.start()
        self.scheduler.start()
        logger.info(
            "stand-in SGLang server (a test double, not a real server) listening on %s:%d, "
            "model=%s, context_length=%d",
            self.config.host,
            self.config.port,
            self.served_name,
            self.context_length,
        )
        self._background.append(asyncio.get_running_loop().create_task(self._warm_up()))

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await self.scheduler.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _warm_up(self) -> None:
        warm = self.config.warmup_seconds + self.config.slow_warmup_seconds
        if self.config.slow_warmup_seconds:
            logger.info(
                "stand-in fault: slow warm-up, %.1f s extra", self.config.slow_warmup_seconds
            )
        await asyncio.sleep(warm)
        self.ready.set()
        logger.info(READY_LINE)
        if self.config.crash_after_seconds is not None:
            await asyncio.sleep(self.config.crash_after_seconds)
            crash(f"--standin-crash-after-seconds={self.config.crash_after_seconds}")

    def _load_chat_template(self, value: str) -> str | None:
        # Kept apart from the tokenizer object, which the caller may share with other servers.
        if os.path.isfile(value):
            with open(value, encoding="utf-8") as fh:
                text = fh.read()
            logger.info("chat template loaded from %s", value)
            return text
        logger.info(
            "stand-in: named chat template %r is not modelled; using the tokenizer's", value
        )
        return None

    # ----- app -------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=256 * 1024**2)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/v1/models", self.models)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/server_info", self.server_info)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/generate", self.generate)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        if self.config.enable_metrics:
            r.add_get("/metrics", self.metrics_endpoint)
        return app

    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        key = self.config.api_key
        path = request.path
        if (
            key
            and request.method != "OPTIONS"
            and not path.startswith("/health")
            and not path.startswith("/metrics")
            and request.headers.get("Authorization") != f"Bearer {key}"
        ):
            return json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ----- simple endpoints ------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready.is_set() or self.hung:
            return web.Response(status=503)
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_name,
            "parent": None,
            "max_model_len": self.context_length,
        }
        return json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.effective_tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        sched = self.scheduler.sched
        info: dict[str, Any] = dict(self.config.sglang_args())
        info.update(
            {
                "status": "Up" if self.ready.is_set() else "Starting",
                "max_total_num_tokens": self.model.max_total_num_tokens,
                "max_req_input_len": self.max_req_input_len,
                "internal_states": [
                    {
                        "last_gen_throughput": self.scheduler.last_gen_throughput,
                        "num_running_reqs": len(sched.running),
                        "num_queue_reqs": len(sched.waiting),
                    }
                ],
                "version": VERSION_STRINGS[self.config.version],
                "standin": True,
                "standin_effective_context_length": self.context_length,
                "standin_ceiling_gen_throughput": perf.ceiling_gen_throughput(self.model),
            }
        )
        info.update(self.config.standin_args())
        return json_response(info)

    async def flush_cache(self, request: web.Request) -> web.Response:
        busy = not self.scheduler.sched.idle
        return web.Response(text=FLUSH_CACHE_TEXT, status=400 if busy else 200)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        sched = self.scheduler.sched
        text = self.metrics.render(
            running=len(sched.running),
            queued=len(sched.waiting),
            gen_throughput=self.scheduler.last_gen_throughput,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # ----- generation endpoints ---------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            body = await _json_body(request)
            req = _parse_chat(body)
        except BadRequest as exc:
            return flat_error(exc.message, _error_type(exc), 400)
        fault = await self._arrival_faults()
        if fault is not None:
            return flat_error(
                "Internal server error: stand-in injected fault", "InternalServerError", 500
            )
        try:
            prompt, p = self._chat_prompt(req)
        except BadRequest as exc:
            return flat_error(exc.message, _error_type(exc), 400)
        error = length_error(
            p,
            req["max_tokens"],
            self.context_length,
            self.max_req_input_len,
            self.config.effective_length_check,
        )
        if error is not None:
            return flat_error(error, "BadRequestError", 400)
        limit = req["max_tokens"]
        if limit is None:
            limit = self.context_length - 2 - p
        completion = self.writer.write(prompt, req["sampling"], limit)
        outcome = await self._run_job(request, p, completion, arrived)
        if outcome is not None:
            return outcome
        return json_response(self._chat_body(req, completion, p))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            body = await _json_body(request)
            text, input_ids, sampling, max_new = _parse_generate(body)
        except BadRequest as exc:
            return flat_error(exc.message, _error_type(exc), 400)
        fault = await self._arrival_faults()
        if fault is not None:
            return web.Response(text="Internal Server Error", status=500)
        if input_ids is not None:
            prompt = self.tokenizer.decode(input_ids)
            p = len(input_ids)
        else:
            assert text is not None
            prompt = text
            p = len(self.tokenizer.encode(text, add_special_tokens=False))
        error = length_error(
            p,
            max_new,
            self.context_length,
            self.max_req_input_len,
            self.config.effective_length_check,
        )
        if error is not None:
            return json_response({"error": {"message": error}}, status=400)
        limit = min(max_new if max_new is not None else 128, self.context_length - 2 - p)
        completion = self.writer.write(prompt, sampling, max(limit, 0))
        outcome = await self._run_job(request, p, completion, arrived)
        if outcome is not None:
            return outcome
        if completion.finish == "stop":
            finish: dict[str, Any] = {"type": "stop", "matched": completion.matched_stop}
        else:
            finish = {"type": "length", "length": completion.completion_tokens}
        return json_response(
            {
                "text": completion.text,
                "output_ids": completion.ids,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": finish,
                    "prompt_tokens": p,
                    "completion_tokens": completion.completion_tokens,
                    "cached_tokens": 0,
                    "weight_version": "default",
                    "e2e_latency": time.monotonic() - arrived,
                },
            }
        )

    async def _arrival_faults(self) -> str | None:
        """Count a generation request and apply arrival-time faults; return "error" for a 500.

        Crashing never returns; hanging never returns (the handler is cancelled when the client
        goes away). Generation requests that arrive during warm-up wait for it to end.
        """
        cfg = self.config
        self.arrivals += 1
        if cfg.crash_after_requests is not None and self.arrivals > cfg.crash_after_requests:
            crash(f"--standin-crash-after-requests={cfg.crash_after_requests}")
        if cfg.hang_after_requests is not None and self.arrivals > cfg.hang_after_requests:
            if not self.hung:
                logger.info("stand-in fault: hanging after %d requests", cfg.hang_after_requests)
            self.hung = True
        if self.hung or (cfg.hang_rate and self._fault_rng.random() < cfg.hang_rate):
            await asyncio.Event().wait()
        if cfg.error_rate and self._fault_rng.random() < cfg.error_rate:
            return "error"
        await self.ready.wait()
        return None

    async def _run_job(
        self, request: web.Request, prompt_tokens: int, completion: Completion, arrived: float
    ) -> web.StreamResponse | None:
        """Wait for the performance model to finish the request; return a response on failure.

        Counters move when a request finishes, as SGLang's do, except generation tokens, which
        the scheduler counts per step so /metrics shows throughput while requests run.
        """
        if self.config.zero_latency:
            self.metrics.generation_tokens_total += completion.completion_tokens
            ttft = 0.0
        else:
            job = perf.Job(prompt_tokens, max(1, completion.completion_tokens))
            try:
                fut = self.scheduler.submit(job)
            except perf.QueueFullError:
                return flat_error(QUEUE_FULL_TEXT, str(HTTPStatus.SERVICE_UNAVAILABLE.value), 503)
            try:
                await fut
            except asyncio.CancelledError:
                # The client went away (handler cancelled): free the slot as SGLang aborts it.
                self.scheduler.cancel(job)
                raise
            ttft = self.scheduler.ttft_seconds(job, arrived)
        self.metrics.num_requests_total += 1
        self.metrics.prompt_tokens_total += prompt_tokens
        self.metrics.observe(ttft=ttft, e2e=time.monotonic() - arrived)
        if self.config.drop_rate and self._fault_rng.random() < self.config.drop_rate:
            return await _drop_connection(request)
        return None

    def _chat_prompt(self, req: dict[str, Any]) -> tuple[str, int]:
        """Return (templated prompt, P), caching by request so a retry costs no tokenization."""
        key = json.dumps(
            [req["messages"], req["tools"], req["template_kwargs"]], sort_keys=True, default=str
        )
        hit = self._prompt_cache.get(key)
        if hit is not None:
            self._prompt_cache.move_to_end(key)
            return hit
        kwargs = dict(req["template_kwargs"])
        if req["tools"] is not None:
            kwargs["tools"] = req["tools"]
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        try:
            prompt = self.tokenizer.apply_chat_template(
                req["messages"], tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # a template error is the caller's input problem
            raise BadRequest(f"chat template failed: {exc}") from exc
        # Same count as apply_chat_template(tokenize=True), which encodes without added BOS/EOS.
        p = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        self._prompt_cache[key] = (prompt, p)
        if len(self._prompt_cache) > _PROMPT_CACHE_SIZE:
            self._prompt_cache.popitem(last=False)
        return prompt, p

    def _chat_body(self, req: dict[str, Any], completion: Completion, p: int) -> dict[str, Any]:
        text = completion.text
        reasoning: str | None = None
        content: str | None = text
        if (
            self.config.reasoning_parser in ("qwen3", "qwen3-thinking", "deepseek-r1")
            and req["separate_reasoning"]
        ):
            reasoning, content = split_reasoning(text)
            if content == "" and self.config.version == "v0.5.6":
                content = None
        n = completion.completion_tokens
        return {
            "id": uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        "reasoning_content": reasoning,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "finish_reason": completion.finish,
                    "matched_stop": completion.matched_stop,
                }
            ],
            "usage": {
                "prompt_tokens": p,
                "completion_tokens": n,
                "total_tokens": p + n,
                "prompt_tokens_details": None,
                "reasoning_tokens": 0,
            },
            "metadata": {"weight_version": "default"},
        }


async def _drop_connection(request: web.Request) -> web.StreamResponse:
    """Close the client's connection without an answer (the client sees a disconnect)."""
    logger.info("stand-in fault: dropping a connection")
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)  # never reaches the client: its connection is gone


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"JSON decode error: {exc}", validation=True) from exc


_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})


def _parse_chat(body: Any) -> dict[str, Any]:
    """Validate a chat completion body the way SGLang's pydantic model would; 400 on error."""
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", validation=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("Field required: messages (a non-empty list)", validation=True)
    clean: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}]: invalid message or role", validation=True)
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise BadRequest(
                        f"messages[{i}]: only text content parts are modelled", validation=True
                    )
                parts.append(str(part.get("text", "")))
            content = " ".join(parts)
        elif content is not None and not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content: Input should be a valid string", validation=True
            )
        clean.append({**msg, "content": content})
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise BadRequest("max_tokens: Input should be a valid integer", validation=True)
    if max_tokens is not None and max_tokens < 0:
        raise BadRequest("max_tokens: must be at least 0", validation=True)
    if body.get("stream"):
        raise BadRequest("the stand-in does not model streaming", validation=True)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest("the stand-in models only n=1", validation=True)
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest("model: Input should be a valid string", validation=True)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest(
            "chat_template_kwargs: Input should be a valid dictionary", validation=True
        )
    separate = body.get("separate_reasoning", True)
    sampling = {
        k: body.get(k)
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        )
        if body.get(k) is not None
    }
    return {
        "messages": clean,
        "max_tokens": max_tokens,
        "model": model,
        "template_kwargs": kwargs,
        "tools": body.get("tools"),
        "separate_reasoning": separate is not False,
        "sampling": sampling,
    }


def _parse_generate(
    body: Any,
) -> tuple[str | None, list[int] | None, dict[str, Any], int | None]:
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", validation=True)
    text = body.get("text")
    input_ids = body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("Either text or input_ids should be provided.", validation=True)
    if text is not None and not isinstance(text, str):
        raise BadRequest("the stand-in models a single text prompt per request", validation=True)
    if input_ids is not None and not (
        isinstance(input_ids, list) and all(isinstance(t, int) for t in input_ids)
    ):
        raise BadRequest("the stand-in models a single input_ids list per request", validation=True)
    if body.get("stream"):
        raise BadRequest("the stand-in does not model streaming", validation=True)
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise BadRequest("sampling_params: Input should be a valid dictionary", validation=True)
    max_new = sampling.get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise BadRequest("max_new_tokens must be a non-negative integer", validation=True)
    key = {k: v for k, v in sampling.items() if k != "max_new_tokens"}
    return text, input_ids, key, max_new


def crash(reason: str) -> None:
    """Exit the process at once, as a crashed server would: no cleanup, connections refused."""
    logger.error("stand-in fault: crashing (%s)", reason)
    for handler in logging.getLogger().handlers + logger.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def load_tokenizer(config: ServerConfig) -> Any:
    """Load the tokenizer from the local tokenizer path (never from a hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.effective_tokenizer_path, local_files_only=True)


def configure_logging(level: str) -> None:
    """Log like SGLang: `[YYYY-mm-dd HH:MM:SS] message` on stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


async def serve(config: ServerConfig, server: StandinServer | None = None) -> None:
    """Run a server (``server``, or a plain stand-in of ``config``) until SIGTERM or SIGINT."""
    server = server or StandinServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    logger.info("stand-in: shutting down")
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m sglang_standin`."""
    config = parse_args(argv)
    configure_logging(config.log_level)
    # SGLang logs its whole ServerArgs, API key included, at start; so does the stand-in, so
    # tests see what a real server log holds (and that log tails are redacted before use).
    logger.info("server_args=ServerArgs(%s)",
                ", ".join(f"{k}={v!r}" for k, v in config.sglang_args(reveal_key=True).items()))
    if not os.path.isdir(config.effective_tokenizer_path):
        # Fail before the slow transformers import; SGLang would fail to load it as well.
        logger.error(
            "stand-in: tokenizer path %s is not a local directory", config.effective_tokenizer_path
        )
        raise SystemExit(2)
    if config.ignored_args:
        logger.info(
            "stand-in: ignoring SGLang flags it does not model: %s", " ".join(config.ignored_args)
        )
    asyncio.run(serve(config))
