"""Planning, the engine step's first half: each prompt's token budget before it is sent.

Prompts are budgeted a chunk at a time, so the first requests go out after one chunk's count,
not the shard's; while the tokenizer loads, prompts that surely fit go with the cap
(``startup.take_sure_fits``). A prompt that cannot fit is skipped with its reason; a whole
conversation's turns are planned by its steps (``turns.ConversationSteps.plan``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from include.engine.config import EngineConfig
from include.engine.conversing import is_conversation
from include.engine.pool import ServerState
from include.engine.startup import take_sure_fits
from include.engine.tally import Tally
from include.engine.turns import ConversationSteps, Item
from include.engine.variants import count_by_thinking, sampling_for
from include.sglang.length import BudgetRule

log = logging.getLogger(__name__)

#: Prompts tokenized per planning step.
PLAN_CHUNK = 256


class Planner:
    """The prompts not budgeted yet, and the rule that budgets them."""

    unplanned: collections.deque[dict[str, Any]]
    #: SGLang's length rule; its context narrowed to the servers' own once they are asked.
    rule: BudgetRule
    cfg: EngineConfig
    count_tokens: Callable[..., list[int]]
    tally: Tally
    #: The run's queue of items waiting for a server: planned items join it.
    pending: collections.deque[Item]
    turns: ConversationSteps | None

    def __init__(self, cfg: EngineConfig, count_tokens: Callable[..., list[int]], tally: Tally,
                 pending: collections.deque[Item], turns: ConversationSteps | None) -> None:
        self.unplanned = collections.deque()
        self.rule = BudgetRule.of(cfg)
        self.cfg = cfg
        self.count_tokens = count_tokens
        self.tally = tally
        self.pending = pending
        self.turns = turns

    def narrow_to(self, servers: Sequence[ServerState]) -> None:
        """Budget with the smallest context: the run's, or a server's max_model_len below it."""
        context = self.cfg.context_length
        reported = [s.context_length for s in servers if s.context_length]
        for server in servers:
            if server.context_length and server.context_length != context:
                log.warning("server %s reports max_model_len %d but context_length is %d; "
                            "budgets use the smaller", server.url, server.context_length,
                            context)
        self.rule = dataclasses.replace(self.rule, context_length=min([context, *reported]))

    def plan_more(self) -> None:
        """Budget the next chunk: items join ``pending``, prompts that cannot fit are skipped."""
        if not self.unplanned:
            return
        rule = self.rule
        if sure := take_sure_fits(self.unplanned, self.count_tokens, rule, PLAN_CHUNK):
            self.pending.extend(Item(r, bound, rule.cap, sampling=self.sampling_of(r))
                                for r, bound in sure)
            return
        chunk = [self.unplanned[i] for i in range(min(PLAN_CHUNK, len(self.unplanned)))]
        single = [p for p in chunk if not is_conversation(p)]
        samplings = [self.sampling_of(p) for p in single]
        counts = self._count(single, samplings)
        for record in chunk:
            if self.turns is not None and is_conversation(record):
                self.turns.plan(Item(record, 0, 0, sampling=self.sampling_of(record)), rule)
        for _ in chunk:  # taken off only once counted: a tokenizer error loses nothing
            self.unplanned.popleft()
        for record, p_tokens, sampling in zip(single, counts, samplings, strict=True):
            budget = rule.budget(p_tokens)
            if budget.skip_reason:
                self.tally.skip(record["id"], p_tokens, budget.skip_reason, budget.detail)
            else:
                self.pending.append(Item(record, p_tokens, budget.max_tokens, sampling=sampling))

    def sampling_of(self, record: dict[str, Any]) -> dict[str, Any]:
        """Return the sampling ``record`` is sent with: the run's, or its variant's."""
        return sampling_for(record["id"], self.cfg.sampling, self.cfg.sampling_variants,
                            self.cfg.seed)

    def _count(self, records: list[dict[str, Any]], samplings: list[dict[str, Any]]
               ) -> list[int]:
        return count_by_thinking(self.count_tokens, [r["messages"] for r in records],
                                 [s.get("enable_thinking") for s in samplings],
                                 self.cfg.sampling.get("enable_thinking"))
