"""The token budget of a conversation's next turn, from the context its history leaves.

The server counts a turn's prompt exactly only when it renders it; before sending, the count
is built from what is known: the previous turn's prompt and sampled ids as the server counted
them, plus the tokens the new dataset turns add (``count``, e.g. the run's tokenizer). The
first turn is counted whole. A turn that cannot fit ends its conversation ``context_exhausted``
before anything is sent, so the server never has to reject it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from include.conversations.chain import (
    ChainState,
    ConversationEnd,
    Message,
    history,
    new_messages,
)
from include.sglang.length import BudgetRule

#: Counts the tokens of messages as the chat template renders them, generation prompt
#: included (``tokenization.tokenizer.count_prompt_tokens`` for one conversation).
TokenCounter = Callable[[Sequence[Message]], int]


@dataclass(frozen=True)
class TurnBudget:
    """The next turn's estimated prompt tokens and its ``max_tokens``, or why it cannot run."""

    prompt_tokens: int
    max_tokens: int
    end_reason: str | None = None
    detail: str = ""


def _sent_tokens(ids: list[int] | None, usage_count: object) -> int:
    if ids is not None:
        return len(ids)
    return usage_count if isinstance(usage_count, int) else 0


def next_prompt_tokens(state: ChainState, count: TokenCounter, slack: int = 0) -> int:
    """Return the next turn's prompt tokens, estimated.

    First turn: ``count`` of the whole request. Later turns: the previous turn's prompt +
    sampled tokens (the server's ids, else its usage) + ``count`` of the new dataset turns +
    ``slack`` (the template's glue between turns, e.g. the new line after ``<|im_end|>`` or a
    closing stop token the sampled ids lack: a ChatML template adds ~2).
    """
    appended = new_messages(state)
    if not state.turns:
        return count(history(state) + appended)
    last = state.turns[-1].result
    usage = last.usage or {}
    previous = (_sent_tokens(last.prompt_token_ids, usage.get("prompt_tokens"))
                + _sent_tokens(last.response_token_ids, usage.get("completion_tokens")))
    return previous + count(appended) + slack


def turn_budget(state: ChainState, count: TokenCounter, rule: BudgetRule, slack: int = 0
                ) -> TurnBudget:
    """Return the next turn's budget: ``rule`` applied to its estimated prompt, with
    ``context_exhausted`` where the room left is below the rule's ``min_completion``."""
    prompt = next_prompt_tokens(state, count, slack)
    budget = rule.budget(prompt)
    if budget.skip_reason is not None:
        return TurnBudget(prompt, 0, ConversationEnd.CONTEXT_EXHAUSTED,
                          f"turn {len(state.turns)}: {budget.detail}")
    return TurnBudget(prompt, budget.max_tokens)
