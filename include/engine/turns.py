"""The engine's steps for whole conversations (``turns: all``); ``conversing`` decides.

A mixin of ``engine.dispatch._Run``: a conversation is one engine item that comes back after each
turn with its next request (``_plan_turn``) until its chain ends (``_finish_conversation``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from include.conversations import chain
from include.engine import client as c
from include.engine.pool import ServerState
from include.sglang.length import token_budget

if TYPE_CHECKING:
    from include.durability.journal import Journal
    from include.engine.config import EngineConfig
    from include.engine.conversing import Conversations
    from include.engine.pool import ServerPool
    from include.engine.tally import Tally


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


class ConversationSteps:
    """What the engine's run (``dispatch._Run``) does with a conversation's turn; the run
    provides the attributes declared here."""

    conv: Conversations | None
    count_tokens: Callable[..., list[int]]
    cfg: EngineConfig
    tally: Tally
    journal: Journal
    pending: collections.deque[Item]
    pool: ServerPool
    _context_length: Callable[[], int]  # the run's method: the context the budgets use

    def _plan_turn(self, item: Item, previous: str | None = None) -> None:
        """Queue a conversation's next turn, or finish it (ended, or its turn cannot fit)."""
        assert self.conv is not None
        thinking = (item.sampling or {}).get("enable_thinking")
        count = None
        if thinking is not None and thinking != self.cfg.sampling.get("enable_thinking"):
            def count(messages: Any) -> int:  # this conversation's variant renders its own way
                return self.count_tokens([list(messages)], enable_thinking=thinking)[0]
        planned = self.conv.plan(item.record["id"], count)
        if not isinstance(planned, tuple):
            self._finish_conversation(item)
            return
        item.messages, item.prompt_tokens, item.max_tokens = planned
        item.attempts = item.charged = 0
        item.length_retried = False
        self.conv.place(item, previous, self.pool.servers if getattr(self, "pool", None)
                        else [], self.pending)

    def _turn_done(self, item: Item, result: c.ChatResult, server: ServerState) -> None:
        assert self.conv is not None
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
            self._finish_conversation(item)
        else:
            self._plan_turn(item, previous=server.url)

    def _turn_failed(self, item: Item, result: c.ChatResult) -> None:
        assert self.conv is not None
        self.conv.end(item.record["id"], chain.ConversationEnd.FAILED,
                      f"{result.error_kind} on {result.server} (HTTP {result.status}): "
                      f"{result.error[:300]}")
        self._finish_conversation(item, failure=result)

    def _rebudget_turn(self, item: Item, server_p: int) -> None:
        # The server counted this turn's prompt: its count is the one to budget from.
        budget = token_budget(server_p, self._context_length(), self.cfg.max_tokens,
                              self.cfg.context_margin, self.cfg.min_completion_tokens)
        if budget.skip_reason:
            assert self.conv is not None
            self.conv.end(item.record["id"], chain.ConversationEnd.CONTEXT_EXHAUSTED,
                          budget.detail + " (server's count)")
            self._finish_conversation(item)
            return
        item.prompt_tokens, item.max_tokens, item.length_retried = server_p, budget.max_tokens, True
        self.pending.appendleft(item)

    def _finish_conversation(self, item: Item, failure: c.ChatResult | None = None) -> None:
        assert self.conv is not None
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

    def _requeue(self, item: Item, front: bool = False) -> None:
        # A conversation's turn goes back through affinity: to the server holding its
        # history, or elsewhere as a counted move when that server rests or is gone.
        if item.messages is not None and self.conv is not None:
            self.conv.place(item, self.conv.previous_server(item.record["id"]),
                            self.pool.servers, self.pending)
        elif front:
            self.pending.appendleft(item)
        else:
            self.pending.append(item)
