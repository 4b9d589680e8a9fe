"""A finished conversation as one completion record (what the generated shard holds).

One record per conversation, id = the prompt's id, so a shard's accounting (one final record
per prompt) is unchanged. ``turn_results`` lists every target turn in order: the dataset slice
it answered (``inputs``), its text, finish reason, stop, usage, server and the server's
prompt and sampled ids; ``end`` says why the conversation stopped. The tokenization stage
(``include.tokenization.conversations``) turns it back into per-turn rows or one whole row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from include.conversations.chain import ChainState, ConversationEnd
from include.outcomes import PromptStatus

#: A record's ``status`` (the generation outcome names).


def turn_results(state: ChainState, extra: Sequence[Mapping[str, Any]] = ()) -> list[dict]:
    """Return the ``turn_results`` of ``state``; ``extra[k]`` adds fields to turn k."""
    out = []
    for turn in state.turns:
        r = turn.result
        entry = {"index": turn.index, "inputs": list(turn.inputs), "text": r.text,
                 "finish_reason": r.finish_reason, "matched_stop": r.matched_stop,
                 "usage": dict(r.usage), "server": r.server}
        if r.prompt_token_ids is not None:
            entry["prompt_token_ids"] = list(r.prompt_token_ids)
        if r.response_token_ids is not None:
            entry["response_token_ids"] = list(r.response_token_ids)
        if turn.index < len(extra):
            entry.update(extra[turn.index])
        out.append(entry)
    return out


def conversation_record(state: ChainState, prompt: Mapping[str, Any],
                        extra: Sequence[Mapping[str, Any]] = (), **fields: Any) -> dict:
    """Return the final record of a finished conversation (``state.end`` set).

    With at least one target turn it is ``completed`` (whatever ended it: the rows are
    exact up to its last turn); with none it is ``skipped`` (its first turn could not fit)
    or ``failed``, as a single-turn prompt would be. ``fields`` (model, sampling, ...) are
    added as they are.
    """
    if state.end is None:
        raise ValueError(f"{state.conversation_id}: not finished")
    end = {"reason": state.end.reason, "detail": state.end.detail}
    base = {"id": prompt["id"], "source": prompt.get("source"), "turns": "all",
            "call_format": state.call_format, "end": end, **fields}
    if state.turns:
        last = state.turns[-1].result
        return {**base, "status": PromptStatus.COMPLETED, "finish_reason": last.finish_reason,
                "turn_results": turn_results(state, extra)}
    exhausted = state.end.reason == ConversationEnd.CONTEXT_EXHAUSTED
    status = PromptStatus.SKIPPED if exhausted else PromptStatus.FAILED
    reason = "prompt_too_long" if exhausted else (fields.get("reason") or ConversationEnd.FAILED)
    return {**base, "status": status, "reason": reason, "detail": state.end.detail,
            "turn_results": []}
