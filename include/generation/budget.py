"""Per-request token budget: never send a request the server must reject for length."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """The completion budget of one prompt, or why it cannot have one."""

    max_tokens: int
    skip_reason: str | None = None
    detail: str = ""


def token_budget(
    prompt_tokens: int, context_length: int, cap: int, margin: int, min_completion: int
) -> Budget:
    """Return ``min(cap, C - P - margin)``, or a skip when that leaves < ``min_completion``.

    SGLang v0.5.6 rejects ``P + max_tokens >= C`` (newer releases ``>``) and prompts within
    six tokens of C, so ``margin`` must be at least 1; the settings default is 16.
    """
    room = context_length - prompt_tokens - margin
    if room < min_completion:
        return Budget(
            0,
            "prompt_too_long",
            f"prompt has {prompt_tokens} tokens; context_length {context_length} - "
            f"context_margin {margin} leaves {room}, below min_completion_tokens "
            f"{min_completion}",
        )
    return Budget(min(cap, room))
