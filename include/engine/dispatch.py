"""Turn one prompt shard into completions by driving every healthy server at once.

``run_shard`` is the whole engine. ``_ShardGeneration.generate`` resumes from the shard's
journal (prompts whose journaled failure was retryable are tried again), generates the rest
and checks at the end that every prompt id is accounted for exactly once (completed +
skipped + failed).

Generating is one step, ``_ShardGeneration._plan_and_send``: plan (``planning.Planner``:
budget the next chunk of prompts from the target tokenizer's count, skip those that cannot
fit), then send (to the server with the most room; a conversation's turn to the server
holding its history). The loop takes the step whenever something changes; each finished
request's callback applies its result (``_ShardGeneration._apply``: ``retry.decide_retry``'s
verdict, carried out by that verdict's handler) and takes the step at once, so a freed slot
is refilled without a round trip through the loop (which failures count against a prompt:
``retry``'s docstring). Every retry is logged with its reason and server, and counted in the
progress line.
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
from include.engine.outcome import ShardOutcome, check_accounting
from include.engine.planning import Planner
from include.engine.pool import ServerPool, ServerState, unauthorized_cause
from include.engine.retry import RetryDecision, Verdict, decide_retry
from include.engine.tally import Tally
from include.engine.turns import ConversationSteps, Item
from include.outcomes import GenerationError
from include.sglang.contract import bearer

__all__ = ["EngineConfig", "GenerationError", "ShardOutcome", "check_accounting", "run_shard"]

log = logging.getLogger(__name__)

#: Retry reason of requests taken back from an ejected server.
SERVER_EJECTED = "server_ejected"

#: What a verdict does to its item, given the request's result, server and decision.
Handler = Callable[[Item, c.ChatResult, ServerState, RetryDecision], None]


class _ShardGeneration:
    """One shard run inside its event loop: what waits, what is in flight, what finished."""

    shard_id: str
    prompts: list[dict[str, Any]]
    journal: Journal
    cfg: EngineConfig
    headers: dict[str, str]
    session: aiohttp.ClientSession
    pool: ServerPool
    tally: Tally
    #: Items waiting for a server; the planner adds to them, as do retries.
    pending: collections.deque[Item]
    in_flight: int
    #: Retries waiting out their backoff.
    delayed: int
    #: Whole conversations (``turns: all``) and the steps on their turns; None without any.
    conv: Conversations | None
    turns: ConversationSteps | None
    #: The prompts not budgeted yet, and the length rule that budgets them.
    planner: Planner
    #: Why the shard stops, once it must: the loop ends and ``run`` raises it.
    fatal: str | None
    #: Set when a request ends or a server's room changes: the loop looks again.
    wake: asyncio.Event
    started: float
    last_dispatch_s: float
    #: One handler per verdict.
    on_verdict: dict[Verdict, Handler]

    def __init__(
        self,
        shard_id: str,
        prompts: list[dict[str, Any]],
        prompt_tokens: Callable[..., list[int]],
        servers: list[str],
        journal: Journal,
        config: EngineConfig,
        session: aiohttp.ClientSession,
    ) -> None:
        self.shard_id = shard_id
        self.prompts = prompts
        self.journal = journal
        self.cfg = config
        self.headers = bearer(config.api_key)
        self.session = session
        self.wake = asyncio.Event()
        self.pool = ServerPool(
            servers, mode=config.concurrency_mode, start_window=config.in_flight_per_server,
            min_window=config.min_in_flight_per_server,
            max_window=config.max_in_flight_per_server,
            cool_down_after_failures=config.cool_down_after_failures,
            health_interval_s=config.health_interval_s, headers=self.headers,
            metrics_interval_s=config.metrics_interval_s, changed=self.wake,
            cool_down_s=config.cool_down_s, cool_down_max_s=config.cool_down_max_s,
            sglang_conn_id=config.sglang_conn_id,
        )
        self.tally = Tally(shard_id, journal, config.sampling)
        self.pending = collections.deque()
        self.in_flight = 0
        self.delayed = 0
        self.conv, self.turns = None, None
        if any(is_conversation(p) for p in prompts):
            self.conv = Conversations(lambda messages: prompt_tokens([list(messages)])[0],
                                      config.conversation_affinity)
            self.turns = ConversationSteps(self.conv, config, prompt_tokens, self.tally,
                                           journal, self.pool, self.pending)
        self.planner = Planner(config, prompt_tokens, self.tally, self.pending, self.turns)
        self.fatal = None
        self.started = time.monotonic()
        self.last_dispatch_s = 0.0
        self.on_verdict = {Verdict.COMPLETE: self._complete, Verdict.REBUDGET: self._rebudget,
                           Verdict.FATAL: self._stop_unauthorized, Verdict.RETRY: self._retry,
                           Verdict.FAIL: self._fail}

    # --- the run -------------------------------------------------------------------------
    async def generate(self) -> ShardOutcome:
        """Resume from the journal, generate what is left, account for every prompt."""
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
            servers=self.pool.stats() if todo else [], started_monotonic=self.started,
            last_dispatch_s=self.last_dispatch_s, requests=tally.requests,
            retries=dict(tally.retries), retried_failures=tally.retried_failures,
            conversations=self.conv.summary() if self.conv is not None else {},
        )

    async def _generate(self, todo: list[dict[str, Any]]) -> None:
        try:
            await self.pool.discover(self.session)
        except PermissionError as exc:
            raise GenerationError(f"{self.shard_id}: {exc}") from None
        self.planner.narrow_to(self.pool.servers)
        # The longest chains first: the last conversations' sequential turns are the tail.
        self.planner.unplanned.extend(self.conv.longest_first(todo) if self.conv is not None
                                      else todo)
        self.planner.plan_more()
        self.pool.start(self.session)
        progress = asyncio.create_task(self.tally.progress_lines(self.cfg.progress_interval_s,
                                                                 self._log_progress))
        try:
            await self._loop()
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

    # --- the loop and its step: plan -> send; each result applied, then the step again --
    async def _loop(self) -> None:
        all_down_since: float | None = None
        while self._work_left() and not self.fatal:
            self._plan_and_send()
            all_down_since = self._stop_if_all_down(all_down_since)
            if not self.fatal:
                self._flush_journal_if_due()
            if self.fatal:
                break
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            except TimeoutError:
                pass

    def _work_left(self) -> bool:
        return bool(self.pending or self.planner.unplanned or self.in_flight or self.delayed
                    or (self.conv is not None and self.conv.waiting()))

    def _plan_and_send(self) -> None:
        """The step: plan while nothing is ready to send, then send to every server with room
        (a conversation's waiting turn to its own server first)."""
        while not self.fatal:
            while not self.pending and self.planner.unplanned:
                self.planner.plan_more()
            taken = (self.conv.take(self.pool.servers, self.pending)
                     if self.conv is not None else None)
            if taken is not None:
                item, server = taken
            elif self.pending and (picked := self.pool.pick()) is not None:
                item, server = self.pending.popleft(), picked
            else:
                return
            self._send(server, item)

    def _send(self, server: ServerState, item: Item) -> None:
        item.attempts += 1
        request = c.ChatRequest(item.record["id"], item.messages or item.record["messages"],
                                item.max_tokens, item.sampling or self.cfg.sampling,
                                self.cfg.model)
        task = asyncio.create_task(c.send_chat(self.session, server.url, request, self.headers,
                                               self.session.timeout))
        seq = self.pool.dispatched(server)
        self.in_flight += 1
        self.tally.requests += 1
        self.last_dispatch_s = time.monotonic() - self.started
        server.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, server, item, seq))

    def _done(self, task: asyncio.Task[c.ChatResult], server: ServerState, item: Item,
              seq: int) -> None:
        # The request's callback: apply its result, then take the step here and now, so the
        # freed slot is refilled at once (a refill on the loop's next turn cost a third of
        # the servers' throughput in bench_saturation).
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
            self._apply(task.result(), server, item, seq)
            self._plan_and_send()
        except Exception as exc:  # a callback must never drop a prompt: stop, keep it unfinished
            if not self.fatal:
                self.fatal = (f"{self.shard_id}: unexpected {type(exc).__name__} while handling "
                              f"prompt {item.record['id']}: {exc}. Finished prompts are in the "
                              "journal; run the shard again to resume.")
                log.exception("%s", self.fatal)
            if item.record["id"] not in self.tally.records:
                self.pending.appendleft(item)

    def _stop_if_all_down(self, since: float | None) -> float | None:
        # Resting servers count as down too (a brownout), even with a trial in flight.
        if self.pool.healthy_count():
            return None
        since = since or time.monotonic()
        down_for = time.monotonic() - since
        if down_for > self.cfg.all_down_timeout_s:
            reasons = "; ".join(f"{s.url}: {s.state}, {s.ejected_reason or 'failing'}"
                                for s in self.pool.servers)
            self.fatal = (
                f"{self.shard_id}: no server in rotation for {down_for:.0f}s ({reasons}). "
                f"{sum(self.tally.counts.values())} finished prompts are in the journal; fix "
                "the servers and run the shard again to resume."
            )
        return since

    def _flush_journal_if_due(self) -> None:
        try:
            self.journal.flush_if_due()
        except Exception as exc:  # a journal write failed: stop, finished work is safe
            self.fatal = (f"{self.shard_id}: the journal cannot be written ({exc}); prompts "
                          "finished before are kept, run the shard again to resume.")

    # --- applying a result: its verdict, then the verdict's handler (one signature) -----
    def _apply(self, result: c.ChatResult, server: ServerState, item: Item, seq: int) -> None:
        if result.ok:
            self.pool.record_success(server, int(result.usage.get("completion_tokens") or 0),
                                     seq)
        counted = result.retryable and self.pool.record_failure(
            server, result.error_kind or "", result.error, item.record["id"], seq)
        decision = decide_retry(result, item.charged, item.length_retried, self.cfg,
                                counted=counted)
        item.charged = decision.charged
        self.on_verdict[decision.verdict](item, result, server, decision)

    def _complete(self, item: Item, result: c.ChatResult, server: ServerState,
                  decision: RetryDecision) -> None:
        if item.is_turn and self.turns is not None:
            self.turns.done(item, result, server, self.planner.rule)
        else:
            self.tally.complete(item.record, result, server.url, item.max_tokens, item.attempts,
                                item.sampling, server.version)

    def _rebudget(self, item: Item, result: c.ChatResult, server: ServerState,
                  decision: RetryDecision) -> None:
        # The server counted the prompt: budget once more from its count. A single prompt's
        # count was our tokenizer's, so a difference means the counts disagree (another chat
        # template?): say so. A turn's count was an estimate from the history.
        server_p = decision.prompt_tokens
        assert server_p is not None  # decide_retry rebudgets only with the server's count
        if not item.is_turn:
            log.warning("%s: prompt %s: server counted %d prompt tokens, we counted %d; "
                        "retrying once with a corrected budget", self.shard_id,
                        item.record["id"], server_p, item.prompt_tokens)
        budget = self.planner.rule.budget(server_p)
        if budget.skip_reason:
            detail = budget.detail + " (server's count)"
            if item.is_turn and self.turns is not None:
                self.turns.exhausted(item, detail)
            else:
                self.tally.skip(item.record["id"], server_p, budget.skip_reason, detail)
            return
        item.prompt_tokens, item.max_tokens, item.length_retried = server_p, budget.max_tokens, True
        self.pending.appendleft(item)

    def _stop_unauthorized(self, item: Item, result: c.ChatResult, server: ServerState,
                           decision: RetryDecision) -> None:
        self.fatal = (
            f"{self.shard_id}: server {server.url} answered 401 Unauthorized: "
            f"{unauthorized_cause(self.cfg.sglang_conn_id)}. Nothing more is sent; run the "
            "shard again once the key matches (finished prompts are kept)."
        )
        # Not the prompt's fault: leave it unfinished so the re-run sends it again.
        self.pending.appendleft(item)

    def _retry(self, item: Item, result: c.ChatResult, server: ServerState,
               decision: RetryDecision) -> None:
        kind = result.error_kind or ""
        self.tally.retries[kind] += 1
        log.info("%s: retrying prompt %s after %s on %s (HTTP %s, attempt %d, %d/%d "
                 "counted against it; server %s): %s", self.shard_id, item.record["id"],
                 kind, server.url, result.status, item.attempts, item.charged,
                 self.cfg.max_attempts, server.state, result.error[:200])
        if decision.delay_s is None:
            # The failing server rests, so sending it again now causes no storm against it.
            self._requeue(item)
            return
        delay = decision.delay_s * random.uniform(0.5, 1.5)  # jitter: retries do not align
        self.delayed += 1

        def requeue() -> None:
            self.delayed -= 1
            self._requeue(item)
            self.wake.set()

        asyncio.get_running_loop().call_later(delay, requeue)

    def _fail(self, item: Item, result: c.ChatResult, server: ServerState,
              decision: RetryDecision) -> None:
        if item.is_turn and self.turns is not None:
            self.turns.failed(item, result)
        else:
            self.tally.fail(item.record["id"], result, item.attempts)

    def _requeue(self, item: Item, front: bool = False) -> None:
        if item.is_turn and self.turns is not None:
            self.turns.requeue(item)
        elif front:
            self.pending.appendleft(item)
        else:
            self.pending.append(item)

    def _log_progress(self, final: bool = False) -> None:
        self.tally.log_progress(len(self.prompts), time.monotonic() - self.started,
                                self.in_flight, self.pool.state_counts(), final)


def run_shard(
    shard_id: str,
    prompts: list[dict[str, Any]],
    servers: list[str],
    journal: Journal,
    config: EngineConfig,
    prompt_tokens: Callable[..., list[int]],
) -> ShardOutcome:
    """Generate completions for one shard; return its outcome once every prompt is final.

    ``prompt_tokens``: ``include.target_tokenizer.count_prompt_tokens`` with the target's
    tokenizer. GenerationError on a wrong API key, an unwritable journal or no server in
    rotation for ``all_down_timeout_s`` (a re-run resumes from the journal).
    """
    return asyncio.run(_run_in_session(shard_id, prompts, servers, journal, config,
                                       prompt_tokens))


async def _run_in_session(shard_id: str, prompts: list[dict[str, Any]], servers: list[str],
                          journal: Journal, config: EngineConfig,
                          prompt_tokens: Callable[..., list[int]]) -> ShardOutcome:
    window_cap = (config.in_flight_per_server if config.concurrency_mode == "fixed"
                  else config.max_in_flight_per_server)
    async with c.new_session((window_cap + 2) * len(servers), config.request_timeout_s,
                             config.connect_timeout_s) as session:
        generation = _ShardGeneration(shard_id, prompts, prompt_tokens, servers, journal, config,
                                      session)
        return await generation.generate()
