"""Whole conversations (``turns: all``) inside the engine: one turn in flight per conversation.

The engine's loop is unchanged: it keeps every server's window full from a queue of items.
A conversation is one item that comes back to the queue after each turn with its next
request, until its chain ends (``include.conversations``), so many conversations' turns share
the windows and chains never wait for each other.

This module holds what the engine does differently for them:

* **budget per turn** from the context the history leaves (``conversations.budget``); a turn
  that cannot fit ends its conversation ``context_exhausted`` and is never sent;
* **one journal record per finished turn** (status ``turn``, not a completion: the report
  and the monitor count the conversation's final record), so a retry or a lost worker
  continues each conversation at its next turn and regenerates nothing twice;
* **affinity**: a next turn waits for the server that answered the previous one, unless it
  moves (why and when: ``conversations.affinity``); every move is counted by reason. A server
  with room and no work of its own takes waiting turns of a far busier one.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from include.conversations import chain
from include.conversations.affinity import Placement, ServerView, choose_server
from include.conversations.budget import turn_budget
from include.conversations.records import conversation_record
from include.conversations.resume import ResumeError, resume, turn_record
from include.outcomes import TURN_KIND, ServerStatus
from include.sglang.length import BudgetRule

log = logging.getLogger(__name__)

#: Template glue between turns the per-turn estimate adds (ChatML: "\n" after <|im_end|>,
#: or the <|im_end|> a turn's sampled ids lack).
TURN_SLACK = 2
#: How far above the least-loaded server's window load a conversation's server may be and
#: keep its next turn (``affinity.choose_server``'s ``busier_by``).
BUSIER_BY = 0.5
#: Turns waiting for a server that rests stay this long before they move: a rest after a
#: blip (one slow health probe) ends in seconds, and the server still holds the histories.
REST_GRACE_S = 10.0


def is_conversation(prompt: Mapping[str, Any]) -> bool:
    """Return whether a prompt record is a whole conversation (prepared with ``turns: all``)."""
    return prompt.get("turns") == "all"


def first_request(prompt: Mapping[str, Any]) -> list[dict[str, str]]:
    """Return the messages the engine sends first for a prompt record: its own, or a whole
    conversation's first turn (the dataset turns up to the first one the target answers,
    ending on a user or tool turn)."""
    if not is_conversation(prompt):
        return [dict(m) for m in prompt["messages"]]
    request = chain.next_request(chain.start(prompt["id"], prompt["messages"],
                                             prompt.get("call_format") or "tool_call"))
    assert not isinstance(request, chain.End)  # start refuses a conversation with no user turn
    return request


@dataclass
class Conversations:
    """The conversations of one shard run: their chains, queues per server and counters."""

    count_one: Callable[[Sequence[Mapping[str, Any]]], int]
    affinity: bool = True
    states: dict[str, chain.ChainState] = field(default_factory=dict)
    #: Per finished turn (by digest): what the journal adds to the server's result.
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Turns waiting for the server that answered their conversation's previous turn.
    homes: dict[str, collections.deque[Any]] = field(default_factory=dict)
    moves: collections.Counter[str] = field(default_factory=collections.Counter)
    #: When each server with waiting turns was first seen resting (the grace's start).
    resting_since: dict[str, float] = field(default_factory=dict)
    kept: int = 0
    turns_done: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0

    # --- resume ---------------------------------------------------------------------------
    def resume(self, shard_id: str, prompts: Sequence[Mapping[str, Any]],
               journal_records: Sequence[Mapping[str, Any]]) -> int:
        """Rebuild each unfinished conversation from its journaled turns; return the turns.

        Raises ResumeError (naming the conversation) when the journal cannot be continued.
        """
        starts = {}
        for p in prompts:
            starts[p["id"]] = chain.start(p["id"], p["messages"], p.get("call_format")
                                          or "tool_call")
        try:
            self.states = resume(journal_records, starts)
        except ResumeError as exc:
            raise ResumeError(f"{shard_id}: {exc}") from None
        kept = ("sampling", "timings", "server_version", "weight_version", "model")
        for record in journal_records:
            if (record.get("kind") == TURN_KIND
                    and record.get("conversation_id") in starts):
                self.extras[record["digest"]] = {k: record[k] for k in kept if k in record}
        return sum(len(s.turns) for s in self.states.values())

    # --- planning -------------------------------------------------------------------------
    def plan(self, prompt_id: str, rule: BudgetRule,
             count: Callable[[Sequence[Mapping[str, Any]]], int] | None = None
             ) -> tuple[list[dict[str, Any]], int, int] | chain.End:
        """Return the next turn's (messages, estimated prompt tokens, max_tokens) under
        ``rule``, or its End (``context_exhausted`` ends the conversation here: nothing is
        sent). ``count``: the conversation's own token counter (a sampling variant with other
        thinking)."""
        state = self.states[prompt_id]
        request = chain.next_request(state)
        if isinstance(request, chain.End):
            return request
        budget = turn_budget(state, count or self.count_one, rule, slack=TURN_SLACK)
        if budget.end_reason is not None:
            self.states[prompt_id] = chain.end_conversation(state, budget.end_reason,
                                                            budget.detail)
            return self.states[prompt_id].end  # type: ignore[return-value]
        return request, budget.prompt_tokens, budget.max_tokens

    def longest_first(self, prompts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Return ``prompts`` with the conversations that have the most turns left first
        (single prompts after them, in order): a chain's turns are sequential, so the
        longest ones started last would leave the servers idle at the end of the shard."""
        def left(p: Mapping[str, Any]) -> int:
            state = self.states.get(p["id"])
            return -chain.turns_left(state) if state is not None else 0
        return sorted(prompts, key=left)

    def previous_server(self, prompt_id: str) -> str | None:
        """Return the server that answered the conversation's previous turn (None: first)."""
        state = self.states[prompt_id]
        return state.turns[-1].result.server if state.turns else None

    # --- a finished turn -----------------------------------------------------------------
    def turn_done(self, prompt_id: str, result: Any, server: str, extra: dict[str, Any]
                  ) -> dict[str, Any]:
        """Apply a completed turn; return its journal record (status ``turn``)."""
        before = len(self.states[prompt_id].turns)
        state = chain.after_turn(self.states[prompt_id], chain.TurnResult(
            result.text, result.finish_reason, result.matched_stop, result.prompt_token_ids,
            result.response_token_ids, result.usage, server))
        self.states[prompt_id] = state
        self.turns_done += 1
        usage = result.usage or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.cached_tokens += int((usage.get("prompt_tokens_details") or {}).get(
            "cached_tokens") or 0)
        if len(state.turns) > before:
            self.extras[state.turns[-1].digest] = extra
            record = {**turn_record(state), **extra, "status": "turn"}
            return record
        return {}  # no usable answer: the conversation ended ``failed`` without this turn

    def end(self, prompt_id: str, reason: str, detail: str) -> None:
        """End a conversation for the engine's own verdict (``failed`` after the retries)."""
        self.states[prompt_id] = chain.end_conversation(self.states[prompt_id], reason, detail)

    def finished(self, prompt_id: str) -> bool:
        """Return whether the conversation has ended."""
        return self.states[prompt_id].finished

    def final_record(self, prompt: Mapping[str, Any], *, retryable: bool = False,
                     **fields: Any) -> dict[str, Any]:
        """Return the conversation's final record (``records.conversation_record``).

        Its top-level ``usage`` and ``timings`` sum its turns (the report's per-completion
        figures); ``retryable`` marks an end for this run only (a re-run continues it).
        """
        state = self.states[prompt["id"]]
        extras = [self.extras.get(t.digest, {}) for t in state.turns]
        record = conversation_record(state, prompt, extras, **fields)
        if state.turns:
            usage: collections.Counter[str] = collections.Counter()
            for t in state.turns:
                for key in ("prompt_tokens", "completion_tokens"):
                    usage[key] += int((t.result.usage or {}).get(key) or 0)
            timings = [e.get("timings") or {} for e in extras]
            record["usage"] = dict(usage)
            record["server"] = state.turns[-1].result.server
            record["timings"] = {
                "latency_s": round(sum(float(t.get("latency_s") or 0) for t in timings), 4),
                "attempts": sum(int(t.get("attempts") or 1) for t in timings),
                "finished_at": max((float(t.get("finished_at") or 0) for t in timings),
                                   default=round(time.time(), 3))}
        if retryable:
            record["end"]["retryable"] = True
        return record

    # --- affinity -------------------------------------------------------------------------
    def place(self, item: Any, previous: str | None, servers: Sequence[Any],
              pending: collections.deque[Any]) -> None:
        """Queue a conversation's next turn: at its server, or anywhere (a counted move)."""
        if not self.affinity:  # the engine's plain routing: the server with the most room
            pending.append(item)
            return
        choice = choose_server(previous, _views(servers), busier_by=BUSIER_BY)
        if previous is not None and not choice.moved and choice.url is not None:
            self.homes.setdefault(choice.url, collections.deque()).append(item)
            self.kept += 1
            return
        if previous is not None and choice.reason == Placement.RESTING:
            # Waits for it through a short rest (``take`` moves it after REST_GRACE_S).
            self.homes.setdefault(previous, collections.deque()).append(item)
            self.kept += 1
            return
        if choice.moved:
            self.moves[choice.reason] += 1
        pending.append(item)

    def take(self, servers: Sequence[Any], pending: collections.deque[Any]
             ) -> tuple[Any, Any] | None:
        """Return a waiting turn and the server to send it to now, or None.

        Turns waiting for a server that left the rotation move to the general queue (counted);
        a server with room takes its own waiting turns first; with no general work left, it
        takes a waiting turn of a server far busier than itself (counted ``busier``).
        """
        if not self.homes:
            return None
        by_url = {s.url: s for s in servers}
        now = time.monotonic()
        for url in [u for u, q in self.homes.items() if q]:
            server = by_url.get(url)
            if server is not None and server.state == ServerStatus.IN_ROTATION:
                self.resting_since.pop(url, None)
                continue
            reason = Placement.GONE if server is None else (
                Placement.EJECTED if server.state == ServerStatus.EJECTED else Placement.RESTING)
            if reason == Placement.RESTING and now - self.resting_since.setdefault(url, now) \
                    < REST_GRACE_S:
                continue
            queue = self.homes.pop(url)
            self.resting_since.pop(url, None)
            self.moves[reason] += len(queue)
            pending.extend(queue)
        ready = [s for s in servers if self.homes.get(s.url) and s.free > 0]
        if ready:
            server = max(ready, key=lambda s: s.free)
            return self.homes[server.url].popleft(), server
        if pending:
            return None
        idle = [s for s in servers if s.free > 0 and s.state == ServerStatus.IN_ROTATION]
        if not idle:
            return None
        taker = max(idle, key=lambda s: s.free)
        waiting = [s for s in servers if self.homes.get(s.url)]
        if not waiting:
            return None
        busiest = max(waiting, key=_load)
        if _load(busiest) - _load(taker) > BUSIER_BY:
            self.moves[Placement.BUSIER] += 1
            return self.homes[busiest.url].popleft(), taker
        return None

    def waiting(self) -> int:
        """Return how many turns wait for their own server."""
        return sum(len(q) for q in self.homes.values())

    def summary(self) -> dict[str, Any]:
        """Return the counters for the shard's outcome and logs."""
        return {"conversations": len(self.states), "turns": self.turns_done,
                "kept_on_server": self.kept, "moved": {str(k): n for k, n in self.moves.items()},
                "ends": dict(chain.count_ends(self.states.values())),
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens}


def _load(server: Any) -> float:
    return server.in_flight / server.window if server.window > 0 else 1.0


def _views(servers: Sequence[Any]) -> list[ServerView]:
    return [ServerView(s.url, s.state, s.in_flight, s.window, s.free) for s in servers]
