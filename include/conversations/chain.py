"""One conversation as a chain of requests: the next request, and the state after a turn.

A dataset conversation (role-mapped messages, its original assistant turns kept) is cut into
*input groups*: the system/user/tool turns before each original assistant turn. Turn k sends
the history so far (earlier groups, each followed by the target's own answer to it as raw
text, thinking included: the server's chat template drops earlier reasoning itself) plus
group k; the original assistant turn after group k is only read, to pair tool calls.

The state is plain data (``ChainState``); ``next_request`` and ``after_turn`` are pure, so
the engine only sends what ``next_request`` returns and folds each result in. A conversation
ends only after a target turn or with no turns at all, never on an unanswered user message:
the history holds exactly the groups that were answered.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from include.conversations.tools import CALL_FORMATS, pair_calls

Message = dict[str, str]



class ConversationEnd(StrEnum):
    """Why a conversation ended; every conversation ends with exactly one."""

    COMPLETED = "completed"
    TOOL_CALL_DIVERGED = "tool_call_diverged"
    CONTEXT_EXHAUSTED = "context_exhausted"
    TRUNCATED = "truncated"
    FAILED = "failed"

ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class TurnResult:
    """What the server returned for one turn (the fields of ``engine.client.ChatResult``)."""

    text: str | None
    finish_reason: str | None
    matched_stop: int | str | None = None
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    server: str = ""


@dataclass(frozen=True)
class Turn:
    """One finished target turn: the dataset slice sent before it, its result, its digest."""

    index: int
    #: ``[start, stop)`` of the dataset messages appended to the history for this turn.
    inputs: tuple[int, int]
    result: TurnResult
    #: Digest of the chain through this turn (the parent of the next turn's record).
    digest: str


@dataclass(frozen=True)
class End:
    """Why a conversation ended, after how many target turns."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class ChainState:
    """Where one conversation stands: its dataset turns, the target's turns, its end if any."""

    conversation_id: str
    source: tuple[Message, ...]
    call_format: str = "tool_call"
    #: Index in ``source`` where the next input group starts.
    next_index: int = 0
    turns: tuple[Turn, ...] = ()
    end: End | None = None

    @property
    def finished(self) -> bool:
        """Return whether the conversation has ended (no further request)."""
        return self.end is not None


ROOT_DIGEST = ""


def turn_digest(parent: str, inputs: tuple[int, int], text: str) -> str:
    """Return the digest of a chain one turn longer than ``parent`` (hex, 16 bytes)."""
    body = json.dumps([parent, list(inputs), text], ensure_ascii=False).encode("utf-8")
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def start(
    conversation_id: str, messages: Sequence[Mapping[str, Any]], call_format: str = "tool_call"
) -> ChainState:
    """Return the state of a conversation before its first turn.

    ``messages``: the whole dataset conversation, roles mapped (``system``, ``user``,
    ``assistant``, ``tool``), original assistant turns kept. Raises ValueError for an unknown
    role or format, or a conversation with no user turn.
    """
    if call_format not in CALL_FORMATS:
        raise ValueError(f"unknown call format {call_format!r}; one of {CALL_FORMATS}")
    source = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ROLES or not isinstance(content, str):
            raise ValueError(f"{conversation_id}: message {i} needs a role in {sorted(ROLES)} "
                             f"and string content, got role {role!r}")
        source.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in source):
        raise ValueError(f"{conversation_id}: no user turn")
    return ChainState(conversation_id, tuple(source), call_format)


def _group(source: Sequence[Message], index: int) -> tuple[int, int, int] | None:
    """Return ``(start, stop, after)``: the input group at ``index`` and the end of the original
    assistant turns after it; None when nothing is left to answer."""
    asks = [i for i in range(index, len(source)) if source[i]["role"] in ("user", "tool")]
    if not asks:
        return None
    stop = asks[0]
    while stop < len(source) and source[stop]["role"] != "assistant":
        stop += 1
    after = stop
    while after < len(source) and source[after]["role"] == "assistant":
        after += 1
    return index, stop, after


def history(state: ChainState) -> list[Message]:
    """Return the conversation as answered so far: each group sent, then the target's answer."""
    out: list[Message] = []
    for turn in state.turns:
        start_, stop = turn.inputs
        out.extend(dict(m) for m in state.source[start_:stop])
        out.append({"role": "assistant", "content": turn.result.text or ""})
    return out


def new_messages(state: ChainState) -> list[Message]:
    """Return the dataset turns the next request appends to the history (empty: none left)."""
    group = None if state.finished else _group(state.source, state.next_index)
    if group is None:
        return []
    return [dict(m) for m in state.source[group[0]:group[1]]]


def next_request(state: ChainState) -> list[Message] | End:
    """Return the messages of the conversation's next turn, or its End."""
    if state.end is not None:
        return state.end
    appended = new_messages(state)
    if not appended:  # only a state built by hand gets here: after_turn ends it first
        return End(ConversationEnd.COMPLETED)
    return history(state) + appended


def after_turn(state: ChainState, result: TurnResult) -> ChainState:
    """Return the state after the target answered the request ``next_request`` gave.

    Keeps the turn unless the server gave no usable answer (no text, or a finish reason
    other than ``stop``/``length``: the conversation ends ``failed`` after its previous
    turn). Then ends it ``truncated`` (finish ``length``), ``completed`` (no dataset turn
    left to answer) or ``tool_call_diverged`` (the next dataset turn cannot follow this one).
    """
    if state.end is not None:
        raise ValueError(f"{state.conversation_id}: ended ({state.end.reason}); no more turns")
    group = _group(state.source, state.next_index)
    if group is None:
        raise ValueError(f"{state.conversation_id}: no request was due")
    begin, stop, after = group
    if result.text is None or result.finish_reason not in ("stop", "length"):
        return end_conversation(state, ConversationEnd.FAILED,
                                f"turn {len(state.turns)}: no usable answer "
                                f"(finish_reason={result.finish_reason!r})")
    parent = state.turns[-1].digest if state.turns else ROOT_DIGEST
    turn = Turn(len(state.turns), (begin, stop), result,
                turn_digest(parent, (begin, stop), result.text))
    state = replace(state, next_index=after, turns=(*state.turns, turn))
    if result.finish_reason == "length":
        return replace(state, end=End(ConversationEnd.TRUNCATED,
                                      f"turn {turn.index} hit max_tokens"))
    following = _group(state.source, after)
    if following is None:
        return replace(state, end=End(ConversationEnd.COMPLETED))
    original = "\n".join(m["content"] for m in state.source[stop:after])
    pairing = pair_calls(original, result.text, state.call_format,
                         results_follow=state.source[after]["role"] == "tool")
    if not pairing.paired:
        return replace(state, end=End(ConversationEnd.TOOL_CALL_DIVERGED,
                                      f"turn {turn.index}: {pairing.detail}"))
    return state


def end_conversation(state: ChainState, reason: str, detail: str = "") -> ChainState:
    """Return the state ended for ``reason`` after its last turn (the engine's verdicts:
    ``failed`` after the retries, ``context_exhausted`` from ``budget.turn_budget``)."""
    if reason not in set(ConversationEnd):
        raise ValueError(f"unknown end reason {reason!r}; "
                         f"one of {', '.join(map(str, ConversationEnd))}")
    if state.end is not None:
        raise ValueError(f"{state.conversation_id}: ended already ({state.end.reason})")
    return replace(state, end=End(reason, detail))


def turns_left(state: ChainState) -> int:
    """Return how many target turns the conversation would still take if none diverged."""
    if state.end is not None:
        return 0
    n, index = 0, state.next_index
    while (group := _group(state.source, index)) is not None:
        n, index = n + 1, group[2]
    return n


def count_ends(states: Iterable[ChainState]) -> collections.Counter[str]:
    """Return how many conversations ended for each reason (every reason present)."""
    counts = collections.Counter(dict.fromkeys(map(str, ConversationEnd), 0))
    counts.update(s.end.reason for s in states if s.end is not None)
    return counts
