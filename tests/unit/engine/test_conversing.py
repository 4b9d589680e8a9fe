"""The engine's conversation queues: longest chains first, a short rest waited out, moves
counted (plain server views, no network)."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest

from include.conversations import chain
from include.engine import conversing
from include.engine.conversing import Conversations


@dataclass
class View:
    url: str
    state: str = "in rotation"
    in_flight: int = 0
    window: int = 8

    @property
    def free(self) -> int:
        return 0 if self.state != "in rotation" else self.window - self.in_flight


def _chat(cid: str, turns: int) -> dict:
    messages = []
    for k in range(turns):
        messages += [{"role": "user", "content": f"{cid} q{k}"},
                     {"role": "assistant", "content": "a"}]
    return {"id": cid, "messages": messages, "turns": "all"}


def _conversations(prompts: list[dict]) -> Conversations:
    conv = Conversations(lambda m: 10)
    conv.resume("shard-00000", prompts, [])
    return conv


def test_the_longest_chains_are_planned_first_and_single_prompts_keep_their_order() -> None:
    prompts = [_chat("a", 2), {"id": "s1", "messages": []}, _chat("b", 8), _chat("c", 5),
               {"id": "s2", "messages": []}]
    conv = _conversations([p for p in prompts if p.get("turns")])
    assert [p["id"] for p in conv.longest_first(prompts)] == ["b", "c", "a", "s1", "s2"]
    assert chain.turns_left(conv.states["b"]) == 8


def test_a_turn_waits_out_a_short_rest_of_its_server_then_moves_counted(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(conversing.time, "monotonic", lambda: clock[0])
    conv = _conversations([_chat("a", 3)])
    home, other = View("http://a"), View("http://b")
    pending: collections.deque = collections.deque()
    conv.place("turn-of-a", "http://a", [home, other], pending)  # kept on its server
    assert conv.waiting() == 1 and not pending
    home.state = "resting"
    assert conv.take([home, other], pending) is None  # the rest has just begun: it waits
    assert conv.waiting() == 1 and conv.moves == {}
    conv.place("turn-of-b", "http://a", [home, other], pending)  # waits too, not moved yet
    clock[0] += conversing.REST_GRACE_S + 1
    item, server = conv.take([home, other], pending) or (None, None)
    assert conv.moves == {"resting": 2} and conv.waiting() == 0
    assert item is None and list(pending) == ["turn-of-a", "turn-of-b"]


@pytest.mark.parametrize("state", ["ejected", None])
def test_turns_of_a_server_that_is_gone_move_at_once(state) -> None:
    conv = _conversations([_chat("a", 3)])
    home, other = View("http://a"), View("http://b")
    pending: collections.deque = collections.deque()
    conv.place("t", "http://a", [home, other], pending)
    servers = [other] if state is None else [View("http://a", state=state), other]
    conv.take(servers, pending)
    assert list(pending) == ["t"] and conv.moves == {"gone" if state is None else state: 1}
