"""Turn one prompt shard into completions by driving every healthy server at once.

``run_shard`` is the whole engine. It resumes from the shard's journal, computes each
prompt's token budget from the target tokenizer (the count SGLang makes), skips prompts that
cannot fit, dispatches the rest over the servers' in-flight windows, retries what can
succeed, records every finished prompt in the journal as it finishes, and checks at the end
that every prompt id is accounted for exactly once (completed + skipped + failed).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from include.generation import client as c
from include.generation.budget import token_budget
from include.generation.journal import Journal
from include.generation.pool import ServerPool, ServerState

log = logging.getLogger(__name__)

COMPLETED, SKIPPED, FAILED = "completed", "skipped", "failed"
#: Prompts tokenized per planning step (see ``_Run._plan_more``).
PLAN_CHUNK = 256


class GenerationError(RuntimeError):
    """The shard cannot go on; finished prompts are safe in the journal."""


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs from the run settings (see ``from_settings``)."""

    model: str
    context_length: int
    max_tokens: int
    context_margin: int
    min_completion_tokens: int
    sampling: dict[str, Any]
    concurrency_mode: str = "adaptive"
    in_flight_per_server: int = 32
    min_in_flight_per_server: int = 8
    max_in_flight_per_server: int = 512
    request_timeout_s: float = 1800.0
    connect_timeout_s: float = 10.0
    max_attempts: int = 4
    eject_after_failures: int = 3
    health_interval_s: float = 5.0
    progress_interval_s: float = 30.0
    api_key: str | None = None
    all_down_timeout_s: float = 600.0
    metrics_interval_s: float = 1.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> EngineConfig:
        """Return the engine configuration of a ``RunSettings``."""
        values = dict(
            model=settings.model_name,
            context_length=settings.context_length,
            max_tokens=settings.max_tokens,
            context_margin=settings.context_margin,
            min_completion_tokens=settings.min_completion_tokens,
            sampling={
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "top_k": settings.top_k,
                "enable_thinking": settings.enable_thinking,
            },
            concurrency_mode=settings.concurrency_mode,
            in_flight_per_server=settings.in_flight_per_server,
            min_in_flight_per_server=settings.min_in_flight_per_server,
            max_in_flight_per_server=settings.max_in_flight_per_server,
            request_timeout_s=settings.request_timeout_s,
            max_attempts=settings.max_attempts,
            eject_after_failures=settings.eject_after_failures,
            health_interval_s=settings.health_interval_s,
            progress_interval_s=settings.progress_interval_s,
            api_key=settings.api_key,
        )
        values.update(overrides)
        return cls(**values)


@dataclass
class _Item:
    record: dict[str, Any]
    prompt_tokens: int
    max_tokens: int
    attempts: int = 0
    length_retried: bool = False


@dataclass
class ShardOutcome:
    """What a shard run did; ``records`` holds the journal's final line per prompt id."""

    shard_id: str
    total: int
    resumed: int
    records: dict[str, dict[str, Any]]
    counts: dict[str, int]
    truncated: int
    elapsed_s: float
    output_tokens: int
    servers: list[dict[str, Any]]
    #: ``time.monotonic()`` when the run started, and seconds from then to the last dispatch
    #: (after it only the drain is left: the longest requests finishing).
    started_monotonic: float = 0.0
    last_dispatch_s: float = 0.0

    def summary(self) -> str:
        """Return the one-line result for logs."""
        return (
            f"{self.shard_id}: {self.counts[COMPLETED]} completed ({self.truncated} truncated), "
            f"{self.counts[SKIPPED]} skipped, {self.counts[FAILED]} failed of {self.total} "
            f"({self.resumed} from the journal) in {self.elapsed_s:.1f}s, "
            f"{self.output_tokens / max(self.elapsed_s, 1e-9):.0f} output tok/s"
        )


def check_accounting(prompt_ids: Sequence[str], records: dict[str, dict[str, Any]]) -> None:
    """Raise GenerationError unless every prompt id has exactly one final record."""
    ids = list(prompt_ids)
    if len(set(ids)) != len(ids):
        dupes = [i for i, n in collections.Counter(ids).items() if n > 1][:5]
        raise GenerationError(f"the shard holds duplicate prompt ids, e.g. {dupes}")
    id_set = set(ids)
    missing = [i for i in ids if i not in records][:5]
    extra = [i for i in records if i not in id_set][:5]
    bad = [i for i, r in records.items() if r.get("status") not in (COMPLETED, SKIPPED, FAILED)]
    if missing or extra or bad:
        raise GenerationError(
            f"accounting failed: missing {missing}, unknown {extra}, bad status {bad[:5]}"
        )


class _Run:
    """The state of one shard run inside its event loop."""

    def __init__(
        self,
        shard_id: str,
        prompts: list[dict[str, Any]],
        prompt_tokens: Callable[[list[list[dict[str, str]]]], list[int]],
        servers: list[str],
        journal: Journal,
        config: EngineConfig,
    ) -> None:
        self.shard_id = shard_id
        self.prompts = prompts
        self.count_tokens = prompt_tokens
        self.urls = servers
        self.journal = journal
        self.cfg = config
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.pending: collections.deque[_Item] = collections.deque()
        self.unplanned: collections.deque[dict[str, Any]] = collections.deque()
        self.delayed = 0
        self.in_flight = 0
        self.records: dict[str, dict[str, Any]] = {}
        self.counts = collections.Counter({COMPLETED: 0, SKIPPED: 0, FAILED: 0})
        self.truncated = 0
        self.output_tokens = 0
        self.completed_here = 0  # completions of this run (not from the journal), for rates
        self.fatal: str | None = None
        self.wake = asyncio.Event()
        self.started = time.monotonic()
        self.last_dispatch_s = 0.0

    # --- recording ---------------------------------------------------------------------
    def _finish(self, record: dict[str, Any]) -> None:
        self.journal.append(record)
        self.records[record["id"]] = record
        self.counts[record["status"]] += 1

    def _skip(self, item: _Item, reason: str, detail: str) -> None:
        self._finish({"id": item.record["id"], "status": SKIPPED, "reason": reason,
                      "detail": detail, "prompt_tokens": item.prompt_tokens})

    def _fail(self, item: _Item, result: c.ChatResult) -> None:
        self._finish({
            "id": item.record["id"], "status": FAILED, "reason": result.error_kind,
            "detail": result.error, "server": result.server, "http_status": result.status,
            "attempts": item.attempts,
        })
        log.warning("%s: prompt %s failed on %s after %d attempt(s): %s (HTTP %s) %s",
                    self.shard_id, item.record["id"], result.server, item.attempts,
                    result.error_kind, result.status, result.error[:300])

    def _complete(self, item: _Item, result: c.ChatResult, server: ServerState) -> None:
        rec = item.record
        out_tokens = int(result.usage.get("completion_tokens") or 0)
        # The prompt (messages, metadata) is already in the prompt shard; the journal keeps
        # only what generation added, and the output joins the two.
        self._finish({
            "id": rec["id"], "source": rec.get("source"), "status": COMPLETED,
            "content": result.content, "reasoning_content": result.reasoning_content,
            "finish_reason": result.finish_reason, "usage": result.usage,
            "model": result.model, "server": server.url,
            "sampling": {**self.cfg.sampling, "max_tokens": item.max_tokens},
            "timings": {"latency_s": round(result.latency_s, 4), "attempts": item.attempts,
                        "finished_at": round(time.time(), 3)},
        })
        if result.finish_reason == "length":
            self.truncated += 1
        self.output_tokens += out_tokens
        self.completed_here += 1

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> ShardOutcome:
        done = self.journal.load()
        ids = {p["id"] for p in self.prompts}
        for pid, record in done.items():
            if pid in ids:
                self.records[pid] = record
                self.counts[record["status"]] += 1
                if record.get("finish_reason") == "length":
                    self.truncated += 1
        resumed = len(self.records)
        todo = [p for p in self.prompts if p["id"] not in self.records]
        log.info("%s: %d prompts, %d already finished in the journal, %d to generate",
                 self.shard_id, len(self.prompts), resumed, len(todo))
        if todo:
            await self._generate(todo)
        self.journal.flush()
        check_accounting([p["id"] for p in self.prompts], self.records)
        elapsed = time.monotonic() - self.started
        return ShardOutcome(
            shard_id=self.shard_id, total=len(self.prompts), resumed=resumed,
            records=self.records, counts=dict(self.counts), truncated=self.truncated,
            elapsed_s=elapsed, output_tokens=self.output_tokens,
            servers=self._server_stats(), started_monotonic=self.started,
            last_dispatch_s=self.last_dispatch_s,
        )

    async def _generate(self, todo: list[dict[str, Any]]) -> None:
        cfg = self.cfg
        window_cap = (cfg.in_flight_per_server if cfg.concurrency_mode == "fixed"
                      else cfg.max_in_flight_per_server)
        connector = aiohttp.TCPConnector(
            limit=window_cap * len(self.urls) + 2 * len(self.urls),
            limit_per_host=0,
            # SGLang closes idle keep-alive connections after ~5 s; drop ours first so a
            # request is rarely written onto a connection the server is closing.
            keepalive_timeout=4.0,
        )
        timeout = aiohttp.ClientTimeout(
            total=cfg.request_timeout_s, sock_connect=cfg.connect_timeout_s
        )
        self.pool = ServerPool(
            self.urls, mode=cfg.concurrency_mode, start_window=cfg.in_flight_per_server,
            min_window=cfg.min_in_flight_per_server, max_window=cfg.max_in_flight_per_server,
            eject_after_failures=cfg.eject_after_failures,
            health_interval_s=cfg.health_interval_s, headers=self.headers,
            metrics_interval_s=cfg.metrics_interval_s, changed=self.wake,
        )
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            try:
                await self.pool.discover(session)
            except PermissionError as exc:
                raise GenerationError(f"{self.shard_id}: {exc}") from None
            self.unplanned = collections.deque(todo)
            self._plan_more()
            self.pool.start(session)
            progress = asyncio.create_task(self._progress_loop())
            try:
                await self._dispatch(session, timeout)
            finally:
                progress.cancel()
                await self.pool.stop()
                # Leaving early (fatal error): take back what is still in flight so nothing
                # half-done reaches the journal; those prompts stay unfinished for a re-run.
                leftovers = [t for s in self.pool.servers for t in s.tasks]
                for task in leftovers:
                    task.cancel()
                await asyncio.gather(*leftovers, return_exceptions=True)
                self._log_progress(final=True)
        if self.fatal:
            raise GenerationError(self.fatal)

    def _context_length(self) -> int:
        reported = {s.url: s.context_length for s in self.pool.servers if s.context_length}
        context = self.cfg.context_length
        for url, value in reported.items():
            if value != context:
                log.warning("server %s reports max_model_len %d but context_length is %d; "
                            "budgets use the smaller", url, value, context)
        return min([context, *reported.values()])

    def _plan_more(self) -> None:
        # Budgets are computed a chunk at a time, so the first requests go out after one
        # chunk's tokenization instead of the whole shard's.
        if not self.unplanned:
            return
        chunk = [self.unplanned[i] for i in range(min(PLAN_CHUNK, len(self.unplanned)))]
        context = self._context_length()
        counts = self.count_tokens([p["messages"] for p in chunk])
        for _ in chunk:  # taken off only once counted: a tokenizer error loses nothing
            self.unplanned.popleft()
        for record, p_tokens in zip(chunk, counts, strict=True):
            budget = token_budget(p_tokens, context, self.cfg.max_tokens,
                                  self.cfg.context_margin, self.cfg.min_completion_tokens)
            item = _Item(record, p_tokens, budget.max_tokens)
            if budget.skip_reason:
                self._skip(item, budget.skip_reason, budget.detail)
            else:
                self.pending.append(item)

    def _fill(self) -> None:
        # Called from the dispatch loop and straight from each request's completion, so a
        # finished request is replaced without a round trip through the loop.
        while not self.fatal:
            while not self.pending and self.unplanned:
                self._plan_more()
            if not self.pending:
                return
            server = self.pool.pick()
            if server is None:
                return
            self._start(self._session, server, self.pending.popleft(), self._timeout)

    async def _dispatch(self, session: aiohttp.ClientSession, timeout: Any) -> None:
        self._session, self._timeout = session, timeout
        all_down_since: float | None = None
        while (
            self.pending or self.unplanned or self.in_flight or self.delayed
        ) and not self.fatal:
            self._fill()
            if self.pool.healthy_count() == 0 and not self.in_flight:
                all_down_since = all_down_since or time.monotonic()
                down_for = time.monotonic() - all_down_since
                if down_for > self.cfg.all_down_timeout_s:
                    reasons = "; ".join(f"{s.url}: {s.ejected_reason}" for s in self.pool.servers)
                    self.fatal = (
                        f"{self.shard_id}: no healthy server for {down_for:.0f}s ({reasons}). "
                        f"{sum(self.counts.values())} finished prompts are in the journal; "
                        "fix the servers and run the shard again to resume."
                    )
                    break
            else:
                all_down_since = None
            self.journal.flush_if_due()
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            except TimeoutError:
                pass

    def _start(self, session: aiohttp.ClientSession, server: ServerState, item: _Item,
               timeout: Any) -> None:
        item.attempts += 1
        request = c.ChatRequest(item.record["id"], item.record["messages"], item.max_tokens,
                                self.cfg.sampling, self.cfg.model)
        task = asyncio.create_task(c.send_chat(session, server.url, request, self.headers,
                                               timeout))
        server.in_flight += 1
        self.in_flight += 1
        self.last_dispatch_s = time.monotonic() - self.started
        server.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, server, item))

    def _done(self, task: asyncio.Task[c.ChatResult], server: ServerState, item: _Item) -> None:
        server.in_flight -= 1
        self.in_flight -= 1
        server.tasks.discard(task)
        self.wake.set()
        if task.cancelled():
            # The pool ejected the server; the attempt does not count against the prompt.
            item.attempts -= 1
            self.pending.appendleft(item)
            return
        try:
            self._handle(task.result(), server, item)
            if self.in_flight or self.pending or self.unplanned:
                self._fill()
        except Exception as exc:  # a callback must never drop a prompt: stop, keep it unfinished
            if not self.fatal:
                self.fatal = (f"{self.shard_id}: unexpected {type(exc).__name__} while handling "
                              f"prompt {item.record['id']}: {exc}. Finished prompts are in the "
                              "journal; run the shard again to resume.")
                log.exception("%s", self.fatal)
            if item.record["id"] not in self.records:
                self.pending.appendleft(item)

    def _handle(self, result: c.ChatResult, server: ServerState, item: _Item) -> None:
        if result.ok:
            self.pool.record_success(server, int(result.usage.get("completion_tokens") or 0))
            self._complete(item, result, server)
        elif result.error_kind == c.LENGTH:
            self._length_error(item, result)
        elif result.error_kind == c.UNAUTHORIZED:
            self.fatal = (
                f"{self.shard_id}: server {server.url} answered 401 Unauthorized: the api_key "
                "setting does not match the servers' --api-key. Nothing more is sent; fix "
                "api_key and run the shard again (finished prompts are kept)."
            )
            # Not the prompt's fault: leave it unfinished so the re-run sends it again.
            item.attempts -= 1
            self.pending.appendleft(item)
        elif result.retryable:
            self.pool.record_failure(server, result.error_kind or "", result.error)
            if item.attempts >= self.cfg.max_attempts:
                self._fail(item, result)
            else:
                self._retry_later(item)
        else:
            self._fail(item, result)

    def _length_error(self, item: _Item, result: c.ChatResult) -> None:
        server_p = c.prompt_tokens_from_length_error(result.error)
        if item.length_retried or server_p is None:
            self._fail(item, result)
            return
        # The server counts P differently from our tokenizer (another chat template?):
        # trust its count, rebudget once, and say so, since it means the counts disagree.
        log.warning("%s: prompt %s: server counted %d prompt tokens, we counted %d; "
                    "retrying once with a corrected budget", self.shard_id, item.record["id"],
                    server_p, item.prompt_tokens)
        budget = token_budget(server_p, self._context_length(), self.cfg.max_tokens,
                              self.cfg.context_margin, self.cfg.min_completion_tokens)
        item.prompt_tokens = server_p
        if budget.skip_reason:
            self._skip(item, budget.skip_reason, budget.detail + " (server's count)")
            return
        item.max_tokens = budget.max_tokens
        item.length_retried = True
        item.attempts -= 1
        self.pending.appendleft(item)

    def _retry_later(self, item: _Item) -> None:
        delay = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2 ** (item.attempts - 1))
        delay *= random.uniform(0.5, 1.5)  # jitter: retries from many prompts do not align
        self.delayed += 1

        def requeue() -> None:
            self.delayed -= 1
            self.pending.append(item)
            self.wake.set()

        asyncio.get_running_loop().call_later(delay, requeue)

    # --- progress ------------------------------------------------------------------------
    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.progress_interval_s)
            self._log_progress()

    def _log_progress(self, final: bool = False) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        finished = sum(self.counts.values())
        total = len(self.prompts)
        rate = self.completed_here / elapsed
        eta = (total - finished) / rate if rate > 0 else float("inf")
        log.info(
            "%s %s: %d/%d finished (ok %d, skipped %d, failed %d, truncated %d) | %.2f req/s, "
            "%.0f output tok/s | ETA %s | in flight %d | servers healthy %d/%d",
            self.shard_id, "done" if final else "progress", finished, total,
            self.counts[COMPLETED], self.counts[SKIPPED], self.counts[FAILED], self.truncated,
            rate, self.output_tokens / elapsed,
            "-" if eta == float("inf") else f"{eta:.0f}s", self.in_flight,
            self.pool.healthy_count(), len(self.pool.servers),
        )

    def _server_stats(self) -> list[dict[str, Any]]:
        pool = getattr(self, "pool", None)
        if pool is None:
            return []
        return [
            {"url": s.url, "model": s.model, "context_length": s.context_length,
             "completed": s.completed, "output_tokens": s.output_tokens,
             "ejections": s.ejections, "healthy": s.healthy, "final_window": s.window}
            for s in pool.servers
        ]


def run_shard(
    shard_id: str,
    prompts: list[dict[str, Any]],
    servers: list[str],
    journal: Journal,
    config: EngineConfig,
    prompt_tokens: Callable[[list[list[dict[str, str]]]], list[int]],
) -> ShardOutcome:
    """Generate completions for one shard; return its outcome once every prompt is final.

    ``prompt_tokens`` returns P for a batch of conversations (use
    ``include.tokenization.count_prompt_tokens`` with the target tokenizer). Raises
    GenerationError on a wrong API key or when no server is healthy for
    ``all_down_timeout_s``; everything finished before is in the journal and a re-run
    resumes from it.
    """
    return asyncio.run(_Run(shard_id, prompts, prompt_tokens, servers, journal, config).run())
