"""The whole-conversation row of a regenerated conversation, where its turns are prefix-stable.

Each turn is also a row of its own, exactly a single-turn row (the tokenization stage writes
those from the turn records). A whole-conversation row is one sequence, the last turn's
prompt + sampled ids, with the loss on every target turn's sampled ids; it is exact only where
each turn's prompt starts, token by token, with the previous turn's prompt + sampled ids (the
server kept the history as it was generated). A template that re-renders history differently
(Qwen3 drops earlier turns' reasoning; a re-encoded answer may split into other tokens) is not
prefix-stable: ``prefix_stability`` says where it first differs, and the caller writes the
per-turn rows instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stability:
    """Whether the turns are prefix-stable; else the first turn and position that differ."""

    stable: bool
    turn: int | None = None
    position: int | None = None
    detail: str = ""


def prefix_stability(turns: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Stability:
    """Return whether each turn's prompt ids start with the previous prompt + sampled ids.

    ``turns``: ``(prompt_ids, sampled_ids)`` per turn, in order. On the first difference,
    ``turn`` is the later turn and ``position`` the index in its prompt ids (the shorter
    length where one sequence ends first).
    """
    for k in range(1, len(turns)):
        before = [*turns[k - 1][0], *turns[k - 1][1]]
        prompt = turns[k][0]
        for i, token in enumerate(before):
            if i >= len(prompt):
                return Stability(False, k, i, f"turn {k}'s prompt has {len(prompt)} ids, "
                                              f"fewer than turn {k - 1}'s {len(before)}")
            if prompt[i] != token:
                return Stability(False, k, i, f"turn {k}'s prompt id {i} is {prompt[i]}, "
                                              f"turn {k - 1} had {token} there")
    return Stability(True)


def whole_row(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]
              ) -> tuple[list[int], list[int]] | Stability:
    """Return a whole conversation's ``(input_ids, loss_mask)`` (the row: the module docstring),
    or why there is none; ``pairs``: each target turn's ``(prompt_ids, sampled_ids)``, in order.
    """
    if not pairs:
        return Stability(False, None, None, "no target turns")
    stability = prefix_stability(pairs)
    if not stability.stable:
        return stability
    ids = [*pairs[-1][0], *pairs[-1][1]]
    mask = [0] * len(ids)
    for prompt, sampled in pairs:
        mask[len(prompt):len(prompt) + len(sampled)] = [1] * len(sampled)
    trained = [t for _, sampled in pairs for t in sampled]
    if [t for t, m in zip(ids, mask, strict=True) if m] != trained:
        # prefix_stability makes this unreachable; a row that is not exact is never written.
        raise AssertionError("the whole-conversation row is not its turns' sampled ids")
    return ids, mask
