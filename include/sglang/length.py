"""SGLang's length rule: the completion budget a request may ask for, and its 400 messages.

A request whose prompt (P tokens, counted as the server counts them) and ``max_tokens`` do not
fit the context length C is rejected with one of three 400 messages (SGLang 0.5.23
``tokenizer_manager.py`` ``_validate_one_request``, then ``managers/utils.py``
``validate_input_length``): every stage that sizes a request (the engine, a conversation's
next turn, preflight) budgets with one ``BudgetRule``, and the engine reads P back from a
rejection with ``prompt_tokens_from_length_error``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_LENGTH_PATTERNS = (
    # P >= C
    re.compile(r"The input \((\d+) tokens\) is longer than the model's context length"),
    # P + M > C (0.5.6: >=)
    re.compile(r"You requested a total of \d+ tokens: (\d+) tokens from the input messages"),
    # P in [C-6, C-1]: the scheduler's max_req_input_len
    re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed length"),
)


@dataclass(frozen=True)
class Budget:
    """The completion budget of one prompt, or why it cannot have one."""

    max_tokens: int
    skip_reason: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class BudgetRule:
    """The limits a request is sized under: the context C, the margin kept free below it, the
    run's ``max_tokens`` cap and the least room worth sending a prompt for.

    SGLang v0.5.6 rejects ``P + max_tokens >= C`` and prompts within six tokens of C; 0.5.23
    accepts ``P + max_tokens = C`` but ends every request at ``C - P - 2`` new tokens
    (``scheduler.py``: ``max_req_len = context_len - 1``, new tokens <= ``max_req_len - P - 1``),
    silently, by length. So ``margin`` is at least 2 (the setting refuses less; default 16):
    every answer gets the tokens it asked for, and one cut by length was cut at its budget.
    """

    context_length: int
    cap: int
    margin: int
    min_completion: int

    @classmethod
    def of(cls, settings: Any) -> BudgetRule:
        """Return the rule of ``RunSettings`` or the engine's config (the same four names)."""
        return cls(settings.context_length, settings.max_tokens, settings.context_margin,
                   settings.min_completion_tokens)

    def budget(self, prompt_tokens: int) -> Budget:
        """Return ``min(cap, C - P - margin)``, or a skip when that leaves < ``min_completion``."""
        room = self.context_length - prompt_tokens - self.margin
        if room < self.min_completion:
            return Budget(
                0,
                "prompt_too_long",
                f"prompt has {prompt_tokens} tokens; context_length {self.context_length} - "
                f"context_margin {self.margin} leaves {room}, below min_completion_tokens "
                f"{self.min_completion}",
            )
        return Budget(min(self.cap, room))


def prompt_tokens_from_length_error(message: str) -> int | None:
    """Return P as the server counted it, read from one of SGLang's length-error messages."""
    for pattern in _LENGTH_PATTERNS:
        match = pattern.search(message)
        if match:
            return int(match.group(1))
    return None
