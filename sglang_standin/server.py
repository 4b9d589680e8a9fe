"""Serve SGLang's HTTP contract from a CPU-only asyncio process (a test double, not a server).

One `StandinServer` owns an aiohttp app, one `SchedulerLoop` (a single task advancing every
running request per decode step), the tokenizer, the radix-cache model and the fault state.
Chat request/answer shapes live in `chat.py`, reasoning parsing in `reasoning.py`, error texts
in `errors.py` (see /work/shared/docs/sglang-contract.md and README.md for the sources).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from sglang_standin import perf, speculative
from sglang_standin.chat import ChatTemplater, answer_for, chat_body, parse_chat
from sglang_standin.cli import ServerConfig
from sglang_standin.completions import completion_body, parse_completion
from sglang_standin.errors import (
    BAD_REQUEST,
    CONVERSION,
    QUEUE_FULL_TEXT,
    BadRequest,
    flat_error,
    json_response,
    length_error,
    lora_error,
    read_json,
    served_name_error,
)
from sglang_standin.generation import THINK_END, Completion, CompletionWriter, LengthModel
from sglang_standin.loop import SchedulerLoop
from sglang_standin.metrics import Metrics
from sglang_standin.native import generate_body, parse_generate
from sglang_standin.radix import RadixCache
from sglang_standin.runtime import (
    CRASH_EXIT_CODE,
    configure_logging,
    crash,
    load_tokenizer,
    main,
    serve,
)

__all__ = [
    "CRASH_EXIT_CODE", "QUEUE_FULL_TEXT", "READY_LINE", "BadRequest", "StandinServer",
    "configure_logging", "flat_error", "json_response", "length_error", "main", "serve",
]  # fmt: skip

logger = logging.getLogger("sglang_standin")

READY_LINE = "The server is fired up and ready to roll!"
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
VERSION_STRINGS = {"v0.5.23": "0.5.23", "v0.5.6": "0.5.6"}
#: http_server.py health_generate sleeps this long before it first looks (fixed, not scaled).
HEALTH_SLEEP_S = 1.0


class StandinServer:
    """Hold the app, tokenizer, scheduler and fault state of one stand-in server."""

    def __init__(self, config: ServerConfig, tokenizer: Any | None = None) -> None:
        self.config = config
        self.served_name = config.effective_served_model_name
        problem = served_name_error(self.served_name)
        if problem:
            raise AssertionError(problem)
        self.version = config.version
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        self.templater = ChatTemplater.load(self.tokenizer, config.chat_template)
        self.context_length = config.resolve_context_length()
        # Resolved as speculative_hook.py does; a ValueError ends start-up, as in SGLang.
        self.spec = speculative.resolve(config.speculative, config.model_path)
        if config.max_running_requests is None:
            config.max_running_requests = speculative.max_running_default(self.spec)
        self.model = config.perf_model()
        kv = self.model.max_total_num_tokens
        self.max_req_input_len = min(self.context_length - 1, kv - 1) - 5
        self.writer = CompletionWriter(
            self.tokenizer,
            seed=config.seed,
            lengths=LengthModel(
                config.median_output_tokens, config.output_sigma, config.max_output_tokens
            ),
            noncanonical_rate=config.noncanonical_rate,
            tool_call_rate=config.tool_call_rate,
        )
        # The scheduler's model_config.think_end_ids: the parser's end tag, encoded.
        self.think_end_ids = list(self.tokenizer.encode(THINK_END, add_special_tokens=False))
        self.cache = None if config.disable_radix_cache else RadixCache(kv)
        self.metrics = Metrics(self.served_name, self.version)
        self.scheduler = SchedulerLoop(self.model, config.max_queued_requests, self.metrics)
        self.ready = asyncio.Event()
        self.hung = False
        self.arrivals = 0
        self._fault_rng = random.Random(config.seed ^ 0x5EED_FA17)
        self._runner: web.AppRunner | None = None
        self._background: list[asyncio.Task[None]] = []
        self.app = self._build_app()

    # ----- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Pretend to load the model with the port closed, open it, then warm up in the background.

        SGLang's `launch_server` (entrypoints/http_server.py) runs
        `Engine._launch_subprocesses`, which waits for the scheduler (weights, CUDA graphs),
        before it starts uvicorn: connections are refused all that time.
        """
        if self.config.load_seconds > 0:
            logger.info("stand-in: loading the model for %.1f s (port closed)",
                        self.config.load_seconds)
            await asyncio.sleep(self.config.load_seconds)
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
            "model=%s, context_length=%d, version=%s",
            self.config.host, self.config.port, self.served_name, self.context_length,
            self.version,
        )  # fmt: skip
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
        r.add_post("/v1/completions", self.completions)
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
        """503 at once while starting; otherwise answer after SGLang's 1 s look-again sleep.

        (A hung real server answers 503 only after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s; the
        stand-in says so at once, to keep fault tests short.)
        """
        if not self.ready.is_set() or self.hung:
            return web.Response(status=503)
        await asyncio.sleep(HEALTH_SLEEP_S)
        return web.Response(status=503 if self.hung else 200)

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
        info.update(self.spec.server_info() if self.spec else speculative.no_spec_server_info())
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
                "version": VERSION_STRINGS[self.version],
                "standin": True,
                "standin_effective_context_length": self.context_length,
                "standin_ceiling_gen_throughput": perf.ceiling_gen_throughput(self.model),
            }
        )
        info.update(self.config.standin_args())
        return json_response(info)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.scheduler.sched.idle:
            return web.Response(text=FLUSH_CACHE_TEXT, status=400)
        if self.cache is not None:
            self.cache.reset()
        return web.Response(text=FLUSH_CACHE_TEXT, status=200)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        sched = self.scheduler.sched
        text = self.metrics.render(
            running=len(sched.running),
            queued=len(sched.waiting),
            gen_throughput=self.scheduler.last_gen_throughput,
            token_usage=sched.kv_used / self.model.max_total_num_tokens,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # ----- generation endpoints ---------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            req = parse_chat(await read_json(request), self.version)
        except BadRequest as exc:
            return flat_error(exc.message, exc.err_type, 400)
        if await self._arrival_faults() is not None:
            return flat_error(
                "Internal server error: stand-in injected fault", "InternalServerError", 500
            )
        try:
            prompt, prompt_ids = self.templater.render(req)
        except BadRequest as exc:
            return flat_error(exc.message, exc.err_type, 400)
        lora = lora_error(req.model, self.served_name)
        if lora is not None:
            # v0.5.6 refuses it while converting the request, v0.5.23 in the tokenizer manager.
            return flat_error(lora, CONVERSION if self.version == "v0.5.6" else BAD_REQUEST, 400)
        p = len(prompt_ids)
        error = length_error(
            p, req.max_tokens, self.context_length, self.max_req_input_len,
            self.config.effective_length_check,
        )  # fmt: skip
        if error is not None:
            return flat_error(error, BAD_REQUEST, 400)
        limit = self._limit(p, req.max_tokens)
        answers = []
        for index in range(req.n):  # n > 1: more samples of one prompt (another RNG key each)
            sampling = req.sampling if index == 0 else {**req.sampling, "choice": index}
            completion = self.writer.write(prompt, sampling, limit, req.steering)
            spec = None if self.spec is None else self.spec.details(
                seed=self.config.seed, prompt=prompt, sampling=sampling,
                completion_tokens=completion.completion_tokens)
            steps = None if self.spec is None else self.spec.forward_steps(
                spec, completion.completion_tokens)
            outcome, cached = await self._run_job(request, prompt_ids, completion, arrived,
                                                  steps)
            if outcome is not None:
                return outcome
            answer = answer_for(
                self.version, self.config.reasoning_parser, req, completion, prompt_ids,
                self.tokenizer, self.templater.template_text, self.think_end_ids,
            )  # fmt: skip
            if self.config.enable_cache_report:
                answer.cached_tokens = cached
            answer.spec_details = spec
            self._log_sampled(prompt_ids, completion)
            answers.append(answer)
        return json_response(chat_body(self.version, req, answers))

    def _limit(self, p: int, max_tokens: int | None) -> int:
        """Return the new tokens a request of P prompt tokens may get: at most C - P - 2.

        SGLang caps every accepted request there whatever its max_tokens (``scheduler.py``
        ``max_req_len = context_len - 1``, new tokens <= ``max_req_len - input_len - 1``), so a
        request sized to the last token ends by length two tokens short.
        """
        cap = self.context_length - 2 - p
        return max(0, cap if max_tokens is None else min(max_tokens, cap))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``/v1/completions``: a raw prompt, as ``serving_completions.py`` answers it."""
        arrived = time.monotonic()
        try:
            req = parse_completion(await read_json(request))
        except BadRequest as exc:
            return flat_error(exc.message, exc.err_type, 400)
        prompt_ids = list(self.tokenizer.encode(req.prompt, add_special_tokens=False))
        error = length_error(
            len(prompt_ids), req.max_tokens, self.context_length, self.max_req_input_len,
            self.config.effective_length_check,
        )  # fmt: skip
        if error is not None:
            return flat_error(error, BAD_REQUEST, 400)
        completion = self.writer.write(req.prompt, req.sampling,
                                       self._limit(len(prompt_ids), req.max_tokens))
        outcome, _ = await self._run_job(request, prompt_ids, completion, arrived)
        if outcome is not None:
            return outcome
        self._log_sampled(prompt_ids, completion)
        return json_response(completion_body(req, completion, prompt_ids))

    def _log_sampled(self, prompt_ids: list[int], completion: Completion) -> None:
        # The stand-in's own record of what it sampled: a pipeline's rows are checked against
        # this, never against the client's copy of the answer.
        folder = self.config.sampled_log_dir
        if not folder:
            return
        line = json.dumps({"prompt_ids": prompt_ids, "sampled_ids": completion.ids,
                           "finish_reason": completion.finish})
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"sampled-{self.config.port}.jsonl"), "a") as fh:
            fh.write(line + "\n")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            req = parse_generate(await read_json(request))
        except BadRequest as exc:
            return flat_error(exc.message, exc.err_type, 400)
        if await self._arrival_faults() is not None:
            return web.Response(text="Internal Server Error", status=500)
        if req.input_ids is not None:
            prompt, input_ids = self.tokenizer.decode(req.input_ids), req.input_ids
        else:
            assert req.text is not None
            prompt = req.text
            input_ids = list(self.tokenizer.encode(req.text, add_special_tokens=False))
        p = len(input_ids)
        error = length_error(
            p, req.max_new_tokens, self.context_length, self.max_req_input_len,
            self.config.effective_length_check,
        )  # fmt: skip
        if error is not None:
            return json_response({"error": {"message": error}}, status=400)
        cap = req.max_new_tokens if req.max_new_tokens is not None else 128
        limit = max(min(cap, self.context_length - 2 - p), 0)
        completion = self.writer.write(prompt, req.sampling, limit)
        outcome, cached = await self._run_job(request, input_ids, completion, arrived)
        if outcome is not None:
            return outcome
        return json_response(generate_body(self.tokenizer, req, completion, p, cached, arrived))

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
        self, request: web.Request, prompt_ids: list[int], completion: Completion, arrived: float,
        steps: int | None = None,
    ) -> tuple[web.StreamResponse | None, int]:
        """Run the request through the performance model; return (failure response, K).

        K, the prompt tokens found in the radix cache, is at most P - 1 (SGLang's
        `Req._compute_max_prefix_len`: one token is always computed, for the logits). The
        prompt is cached on arrival (SGLang caches it once prefilled) and prompt + output but
        the last token once done. Counters move when a request finishes, as SGLang's do,
        except generation tokens, which the scheduler counts per step so /metrics shows
        throughput while requests run.
        """
        cached = 0
        p = len(prompt_ids)
        if self.cache is not None:
            cached = min(self.cache.match_prefix(prompt_ids), max(p - 1, 0))
            self.cache.insert(prompt_ids)
        if self.config.zero_latency:
            self.metrics.generation_tokens_total += completion.completion_tokens
            ttft = 0.0
        else:
            # ``steps``: the forward passes under speculative decoding (one per verify).
            job = perf.Job(p, max(1, steps or completion.completion_tokens), cached_tokens=cached)
            try:
                fut = self.scheduler.submit(job)
            except perf.QueueFullError:
                text = str(HTTPStatus.SERVICE_UNAVAILABLE.value)
                return flat_error(QUEUE_FULL_TEXT, text, 503), cached
            try:
                await fut
            except asyncio.CancelledError:
                # The client went away (handler cancelled): free the slot as SGLang aborts it.
                self.scheduler.cancel(job)
                raise
            ttft = self.scheduler.ttft_seconds(job, arrived)
        if self.cache is not None:
            self.cache.insert(prompt_ids + completion.ids[:-1])
        self.metrics.num_requests_total += 1
        self.metrics.prompt_tokens_total += p
        self.metrics.cached_tokens_total += cached
        self.metrics.observe(ttft=ttft, e2e=time.monotonic() - arrived)
        if self.config.drop_rate and self._fault_rng.random() < self.config.drop_rate:
            return await _drop_connection(request), cached
        return None, cached


async def _drop_connection(request: web.Request) -> web.StreamResponse:
    """Close the client's connection without an answer (the client sees a disconnect)."""
    logger.info("stand-in fault: dropping a connection")
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)  # never reaches the client: its connection is gone
