"""Turn one prompt shard into completions by driving every healthy server at once.

``run_shard`` is the whole engine. It resumes from the shard's journal (prompts whose
journaled failure was retryable are tried again), computes each prompt's token budget from
the target tokenizer (the count SGLang makes), skips prompts that cannot fit, dispatches the
rest over the servers' in-flight windows, retries what can succeed, records every finished
prompt in the journal as it finishes, and checks at the end that every prompt id is
accounted for exactly once (completed + skipped + failed).

What becomes of a prompt after each request (complete, retry, fail, rebudget, or stop the
shard) is decided by ``retry.decide_retry``; a retryable failure counts against the prompt's
``max_attempts`` only when its server was working for others at the time (see
``ServerPool.record_failure``). Every retry is logged with its reason and server, and counted
in the progress line.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from include.durability.journal import Journal
from include.engine import client as c
from include.engine.config import EngineConfig
from include.engine.conversing import Conversations, is_conversation
from include.engine.outcome import (
    GenerationError,
    ShardOutcome,
    check_accounting,
)
from include.engine.pool import ServerPool, ServerState, unauthorized_cause
from include.engine.retry import decide_retry
from include.engine.startup import take_sure_fits
from include.engine.tally import Tally
from include.engine.turns import ConversationSteps, Item
from include.engine.variants import count_by_thinking, sampling_for
from include.sglang.contract import bearer
from include.sglang.length import token_budget

__all__ = ["EngineConfig", "GenerationError", "ShardOutcome", "check_accounting", "run_shard"]

log = logging.getLogger(__name__)

#: Prompts tokenized per planning step (see ``_Run._plan_more``).
PLAN_CHUNK = 256
#: Retry reason of requests taken back from an ejected server.
SERVER_EJECTED = "server_ejected"
#: How often the progress loop looks for the first answers: its first line follows them
#: within this (progress lines only).
FIRST_ANSWER_POLL_S = 0.25


class _Run(ConversationSteps):
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
        self.headers = bearer(config.api_key)
        self.pending: collections.deque[Item] = collections.deque()
        self.unplanned: collections.deque[dict[str, Any]] = collections.deque()
        self.delayed = 0
        self.in_flight = 0
        self.tally = Tally(shard_id, journal, config.sampling)
        self.fatal: str | None = None
        self.wake = asyncio.Event()
        self.started = time.monotonic()
        self.last_dispatch_s = 0.0
        self._length_warned: set[tuple[str, int]] = set()
        self.conv = Conversations(
            lambda messages: self.count_tokens([list(messages)])[0], self._context_length,
            config.max_tokens, config.context_margin, config.min_completion_tokens,
            config.conversation_affinity,
        ) if any(is_conversation(p) for p in prompts) else None

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> ShardOutcome:
        tally = self.tally
        resumed = tally.resume(p["id"] for p in self.prompts)
        todo = [p for p in self.prompts if p["id"] not in tally.records]
        log.info("%s: %d prompts, %d already finished in the journal, %d to generate (%d of "
                 "them failed retryably before and are tried again)", self.shard_id,
                 len(self.prompts), resumed, len(todo), tally.retried_failures)
        if self.conv is not None:
            conversations = [p for p in todo if is_conversation(p)]
            turns = self.conv.resume(self.shard_id, conversations,
                                     list(self.journal.load().values()))
            log.info("%s: %d whole conversations to go on with (%d of their turns already in "
                     "the journal)", self.shard_id, len(conversations), turns)
        if todo:
            await self._generate(todo)
        # The pool is stopped: nothing waits on the loop while the last segment goes out.
        self.journal.flush()
        check_accounting([p["id"] for p in self.prompts], tally.records)
        return ShardOutcome(
            shard_id=self.shard_id, total=len(self.prompts), resumed=resumed,
            records=tally.records, counts=dict(tally.counts), truncated=tally.truncated,
            elapsed_s=time.monotonic() - self.started, output_tokens=tally.output_tokens,
            servers=self._server_stats(), started_monotonic=self.started,
            last_dispatch_s=self.last_dispatch_s, requests=tally.requests,
            retries=dict(tally.retries), retried_failures=tally.retried_failures,
            conversations=self.conv.summary() if self.conv is not None else {},
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
            cool_down_after_failures=cfg.cool_down_after_failures,
            health_interval_s=cfg.health_interval_s, headers=self.headers,
            metrics_interval_s=cfg.metrics_interval_s, changed=self.wake,
            cool_down_s=cfg.cool_down_s, cool_down_max_s=cfg.cool_down_max_s,
            sglang_conn_id=cfg.sglang_conn_id,
        )
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            try:
                await self.pool.discover(session)
            except PermissionError as exc:
                raise GenerationError(f"{self.shard_id}: {exc}") from None
            # The longest chains first: the last conversations' sequential turns are the tail.
            self.unplanned = collections.deque(
                self.conv.longest_first(todo) if self.conv is not None else todo)
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
        if getattr(self, "pool", None) is None:
            return self.cfg.context_length
        reported = {s.url: s.context_length for s in self.pool.servers if s.context_length}
        context = self.cfg.context_length
        for url, value in reported.items():
            # Said once per server: whole conversations ask again for every turn.
            if value != context and (url, value) not in self._length_warned:
                self._length_warned.add((url, value))
                log.warning("server %s reports max_model_len %d but context_length is %d; "
                            "budgets use the smaller", url, value, context)
        return min([context, *reported.values()])

    def _plan_more(self) -> None:
        # Budgets a chunk at a time: the first requests go out after one chunk's count, not
        # the shard's; while the tokenizer loads, prompts that surely fit go with the cap.
        if not self.unplanned:
            return
        context, cfg = self._context_length(), self.cfg
        if sure := take_sure_fits(self.unplanned, self.count_tokens, context, cfg.max_tokens,
                                  cfg.context_margin, PLAN_CHUNK):
            self.pending.extend(Item(r, bound, cfg.max_tokens, sampling=self.sampling_of(r))
                                for r, bound in sure)
            return
        chunk = [self.unplanned[i] for i in range(min(PLAN_CHUNK, len(self.unplanned)))]
        single = [p for p in chunk if not is_conversation(p)]
        samplings = [self.sampling_of(p) for p in single]
        counts = self._count(single, samplings)
        for record in chunk:
            if is_conversation(record):
                self._plan_turn(Item(record, 0, 0, sampling=self.sampling_of(record)))
        for _ in chunk:  # taken off only once counted: a tokenizer error loses nothing
            self.unplanned.popleft()
        for record, p_tokens, sampling in zip(single, counts, samplings, strict=True):
            budget = token_budget(p_tokens, context, self.cfg.max_tokens,
                                  self.cfg.context_margin, self.cfg.min_completion_tokens)
            item = Item(record, p_tokens, budget.max_tokens, sampling=sampling)
            if budget.skip_reason:
                self.tally.skip(item.record["id"], item.prompt_tokens, budget.skip_reason,
                                budget.detail)
            else:
                self.pending.append(item)

    def sampling_of(self, record: dict[str, Any]) -> dict[str, Any]:
        """Return the sampling ``record`` is sent with: the run's, or its variant's."""
        return sampling_for(record["id"], self.cfg.sampling, self.cfg.sampling_variants,
                            self.cfg.seed)

    def _count(self, records: list[dict[str, Any]], samplings: list[dict[str, Any]]
               ) -> list[int]:
        return count_by_thinking(self.count_tokens, [r["messages"] for r in records],
                                 [s.get("enable_thinking") for s in samplings],
                                 self.cfg.sampling.get("enable_thinking"))

    def _fill(self) -> None:
        # Called from the dispatch loop and straight from each request's completion, so a
        # finished request is replaced without a round trip through the loop.
        while not self.fatal:
            while not self.pending and self.unplanned:
                self._plan_more()
            if self.conv is not None:
                taken = self.conv.take(self.pool.servers, self.pending)
                if taken is not None:
                    self._start(self._session, taken[1], taken[0], self._timeout)
                    continue
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
            or (self.conv is not None and self.conv.waiting())
        ) and not self.fatal:
            self._fill()
            # Resting servers count as down too (a brownout), even with a trial in flight.
            if self.pool.healthy_count() == 0:
                all_down_since = all_down_since or time.monotonic()
                down_for = time.monotonic() - all_down_since
                if down_for > self.cfg.all_down_timeout_s:
                    reasons = "; ".join(f"{s.url}: {s.state}, {s.ejected_reason or 'failing'}"
                                        for s in self.pool.servers)
                    self.fatal = (
                        f"{self.shard_id}: no server in rotation for {down_for:.0f}s "
                        f"({reasons}). {sum(self.tally.counts.values())} finished prompts are in "
                        "the journal; fix the servers and run the shard again to resume."
                    )
                    break
            else:
                all_down_since = None
            try:
                self.journal.flush_if_due()
            except Exception as exc:  # a journal write failed: stop, finished work is safe
                self.fatal = (f"{self.shard_id}: the journal cannot be written ({exc}); "
                              "prompts finished before are kept, run the shard again to "
                              "resume.")
                break
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            except TimeoutError:
                pass

    def _start(self, session: aiohttp.ClientSession, server: ServerState, item: Item,
               timeout: Any) -> None:
        item.attempts += 1
        request = c.ChatRequest(item.record["id"], item.messages or item.record["messages"],
                                item.max_tokens, item.sampling or self.cfg.sampling,
                                self.cfg.model)
        task = asyncio.create_task(c.send_chat(session, server.url, request, self.headers,
                                               timeout))
        seq = self.pool.dispatched(server)
        self.in_flight += 1
        self.tally.requests += 1
        self.last_dispatch_s = time.monotonic() - self.started
        server.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, server, item, seq))

    def _done(self, task: asyncio.Task[c.ChatResult], server: ServerState, item: Item,
              seq: int) -> None:
        server.in_flight -= 1
        self.in_flight -= 1
        server.tasks.discard(task)
        self.wake.set()
        if task.cancelled():
            # The pool ejected the server (gone); the attempt does not count against the prompt.
            # One line per ejection names the count: not one per request taken back.
            self.tally.retries[SERVER_EJECTED] += 1
            self._requeue(item, front=True)
            return
        try:
            self._handle(task.result(), server, item, seq)
            if self.in_flight or self.pending or self.unplanned or (
                    self.conv is not None and self.conv.waiting()):
                self._fill()
        except Exception as exc:  # a callback must never drop a prompt: stop, keep it unfinished
            if not self.fatal:
                self.fatal = (f"{self.shard_id}: unexpected {type(exc).__name__} while handling "
                              f"prompt {item.record['id']}: {exc}. Finished prompts are in the "
                              "journal; run the shard again to resume.")
                log.exception("%s", self.fatal)
            if item.record["id"] not in self.tally.records:
                self.pending.appendleft(item)

    def _handle(self, result: c.ChatResult, server: ServerState, item: Item, seq: int) -> None:
        if result.ok:
            self.pool.record_success(server, int(result.usage.get("completion_tokens") or 0),
                                     seq)
        kind = result.error_kind or ""
        counted = result.retryable and self.pool.record_failure(
            server, kind, result.error, item.record["id"], seq)
        decision = decide_retry(result, item.charged, item.length_retried, self.cfg,
                                counted=counted)
        item.charged = decision.charged
        if decision.verdict == "complete" and item.messages is not None:
            self._turn_done(item, result, server)
        elif decision.verdict == "complete":
            self.tally.complete(item.record, result, server.url, item.max_tokens, item.attempts,
                                item.sampling, server.version)
        elif decision.verdict == "rebudget" and item.messages is not None:
            self._rebudget_turn(item, decision.prompt_tokens)
        elif decision.verdict == "rebudget":
            self._rebudget(item, decision.prompt_tokens)
        elif decision.verdict == "fatal":
            self.fatal = (
                f"{self.shard_id}: server {server.url} answered 401 Unauthorized: "
                f"{unauthorized_cause(self.cfg.sglang_conn_id)}. Nothing more is sent; run the "
                "shard again once the key matches (finished prompts are kept)."
            )
            # Not the prompt's fault: leave it unfinished so the re-run sends it again.
            self.pending.appendleft(item)
        elif decision.verdict == "retry":
            self.tally.retries[kind] += 1
            log.info("%s: retrying prompt %s after %s on %s (HTTP %s, attempt %d, %d/%d "
                     "counted against it; server %s): %s", self.shard_id, item.record["id"],
                     kind, server.url, result.status, item.attempts, item.charged,
                     self.cfg.max_attempts, server.state, result.error[:200])
            self._retry_later(item, decision.delay_s)
        elif item.messages is not None:
            self._turn_failed(item, result)
        else:
            self.tally.fail(item.record["id"], result, item.attempts)

    def _rebudget(self, item: Item, server_p: int) -> None:
        # The server counts P differently from our tokenizer (another chat template?):
        # trust its count, rebudget once, and say so, since it means the counts disagree.
        log.warning("%s: prompt %s: server counted %d prompt tokens, we counted %d; "
                    "retrying once with a corrected budget", self.shard_id, item.record["id"],
                    server_p, item.prompt_tokens)
        budget = token_budget(server_p, self._context_length(), self.cfg.max_tokens,
                              self.cfg.context_margin, self.cfg.min_completion_tokens)
        item.prompt_tokens = server_p
        if budget.skip_reason:
            self.tally.skip(item.record["id"], server_p, budget.skip_reason,
                            budget.detail + " (server's count)")
            return
        item.max_tokens = budget.max_tokens
        item.length_retried = True
        self.pending.appendleft(item)

    def _retry_later(self, item: Item, delay_s: float | None) -> None:
        if delay_s is None:
            # The failing server rests, so sending it again now causes no storm against it.
            self._requeue(item)
            return
        delay = delay_s * random.uniform(0.5, 1.5)  # jitter: retries from many prompts do not align
        self.delayed += 1

        def requeue() -> None:
            self.delayed -= 1
            self._requeue(item)
            self.wake.set()

        asyncio.get_running_loop().call_later(delay, requeue)

    # --- progress ------------------------------------------------------------------------
    async def _progress_loop(self) -> None:
        """The first line soon after the first answers (so it has a rate and an ETA; a line
        at 1 s said "0/20" and short shards then said nothing until done, issue 34), or after
        one interval if no answer comes; then one line per interval."""
        first = (self.tally.completed_here, self.tally.output_tokens)
        waited = 0.0
        while ((self.tally.completed_here, self.tally.output_tokens) == first
               and waited < self.cfg.progress_interval_s):
            await asyncio.sleep(FIRST_ANSWER_POLL_S)
            waited += FIRST_ANSWER_POLL_S
        while True:
            self._log_progress()
            await asyncio.sleep(self.cfg.progress_interval_s)

    def _log_progress(self, final: bool = False) -> None:
        self.tally.log_progress(len(self.prompts), time.monotonic() - self.started,
                                self.in_flight, self.pool.state_counts(), final)

    def _server_stats(self) -> list[dict[str, Any]]:
        pool = getattr(self, "pool", None)
        if pool is None:
            return []
        return [
            {"url": s.url, "model": s.model, "context_length": s.context_length,
             "completed": s.completed, "output_tokens": s.output_tokens, "sent": s.sent,
             "ejections": s.ejections, "cool_downs": s.cool_downs, "healthy": s.healthy,
             "final_window": s.window}
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
    ``include.target_tokenizer.count_prompt_tokens`` with the target tokenizer). Raises
    GenerationError on a wrong API key, a journal that cannot be written, or when no server
    is in rotation for ``all_down_timeout_s``; everything finished before is in the journal
    and a re-run resumes from it.
    """
    return asyncio.run(_Run(shard_id, prompts, prompt_tokens, servers, journal, config).run())
