"""The engine's steps for whole conversations (``turns: all``; how the engine drives them:
``conversing``'s docstring): ``ConversationSteps.plan`` a conversation's next request,
``ConversationSteps.finish`` its end. The run (``engine.dispatch._ShardGeneration``) holds one
``ConversationSteps`` when its shard has conversations."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from include.conversations import chain
from include.durability.journal import Journal
from include.engine import client as c
from include.engine.config import EngineConfig
from include.engine.conversing import Conversations
from include.engine.pool import ServerPool, ServerState
from include.engine.tally import Tally
from include.sglang.length import BudgetRule


@dataclass
class Item:
    """One prompt (or conversation) in the engine: its record, budget and tries."""

    record: dict[str, Any]
    prompt_tokens: int
    max_tokens: int
    #: Requests sent for this prompt, and the failures among them counted against it.
    attempts: int = 0
    charged: int = 0
    length_retried: bool = False
    #: A whole conversation's current request (None: the prompt's own messages).
    messages: list[dict[str, str]] | None = None
    #: The sampling this prompt is sent with (the run's, or its variant's).
    sampling: dict[str, Any] | None = None

    @property
    def is_turn(self) -> bool:
        """Whether this item is a whole conversation's turn (not a single prompt)."""
        return self.messages is not None


class ConversationSteps:
    """What the run does with a conversation's turn: plan it, apply its answer, end it."""

    conv: Conversations
    cfg: EngineConfig
    count_tokens: Callable[..., list[int]]
    tally: Tally
    journal: Journal
    pool: ServerPool
    #: The run's queue of items waiting for a server (shared: a planned turn joins it).
    pending: collections.deque[Item]

    def __init__(self, conv: Conversations, cfg: EngineConfig,
                 count_tokens: Callable[..., list[int]], tally: Tally, journal: Journal,
                 pool: ServerPool, pending: collections.deque[Item]) -> None:
        self.conv = conv
        self.cfg = cfg
        self.count_tokens = count_tokens
        self.tally = tally
        self.journal = journal
        self.pool = pool
        self.pending = pending

    def plan(self, item: Item, rule: BudgetRule, previous: str | None = None) -> None:
        """Queue a conversation's next turn, or finish it (ended, or its turn cannot fit)."""
        thinking = (item.sampling or {}).get("enable_thinking")
        count = None
        if thinking is not None and thinking != self.cfg.sampling.get("enable_thinking"):
            def count(messages: Any) -> int:  # this conversation's variant renders its own way
                return self.count_tokens([list(messages)], enable_thinking=thinking)[0]
        planned = self.conv.plan(item.record["id"], rule, count)
        if not isinstance(planned, tuple):
            self.finish(item)
            return
        item.messages, item.prompt_tokens, item.max_tokens = planned
        item.attempts = item.charged = 0
        item.length_retried = False
        self.conv.place(item, previous, self.pool.servers, self.pending)

    def done(self, item: Item, result: c.ChatResult, server: ServerState,
             rule: BudgetRule) -> None:
        """Journal a finished turn; plan the next one, or finish the conversation."""
        extra = {"model": result.model, "server_version": server.version,
                 "weight_version": result.weight_version,
                 "sampling": {**(item.sampling or self.cfg.sampling),
                              "max_tokens": item.max_tokens},
                 "timings": {"latency_s": round(result.latency_s, 4), "attempts": item.attempts,
                             "finished_at": round(time.time(), 3)}}
        record = self.conv.turn_done(item.record["id"], result, server.url, extra)
        if record:
            self.journal.append(record)
            self.tally.output_tokens += int(result.usage.get("completion_tokens") or 0)
            self.tally.completed_here += 1
        if self.conv.finished(item.record["id"]):
            self.finish(item)
        else:
            self.plan(item, rule, previous=server.url)

    def failed(self, item: Item, result: c.ChatResult) -> None:
        """End a conversation whose turn failed for good."""
        self.conv.end(item.record["id"], chain.ConversationEnd.FAILED,
                      f"{result.error_kind} on {result.server} (HTTP {result.status}): "
                      f"{result.error[:300]}")
        self.finish(item, failure=result)

    def exhausted(self, item: Item, detail: str) -> None:
        """End a conversation whose next turn cannot fit the context (by the server's count)."""
        self.conv.end(item.record["id"], chain.ConversationEnd.CONTEXT_EXHAUSTED, detail)
        self.finish(item)

    def finish(self, item: Item, failure: c.ChatResult | None = None) -> None:
        """Journal the conversation's final record and count it."""
        fields: dict[str, Any] = {"model": self.cfg.model,
                                  "sampling": dict(item.sampling or self.cfg.sampling)}
        if failure is not None:
            fields.update(reason=failure.error_kind, http_status=failure.status,
                          attempts=item.attempts)
        record = self.conv.final_record(item.record, retryable=bool(failure and failure.retryable),
                                        **fields)
        self.tally.finish(record)
        if record.get("finish_reason") == "length":
            self.tally.truncated += 1

    def requeue(self, item: Item) -> None:
        """Send a turn back through affinity: to the server holding its history, or elsewhere
        as a counted move when that server rests or is gone."""
        self.conv.place(item, self.conv.previous_server(item.record["id"]), self.pool.servers,
                        self.pending)
