"""Conversations shaped like the source datasets, and a server double with plain-int ids.

``IntServer`` renders ChatML with one id per word, so its ids are prefix-stable by
construction exactly when the history it is sent holds the text it sampled; the rows tests
use the real stand-in tokenizer where the template matters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from include.conversations import chain

START, END, NEWLINE = 1, 2, 3
ROLE_IDS = {"system": 10, "user": 11, "assistant": 12, "tool": 13}


def call(name: str, **arguments: Any) -> str:
    """Return one Hermes/Qwen3 tool call block."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def word_ids(text: str) -> list[int]:
    return [100 + sum(map(ord, w)) % 5000 for w in text.split()]


class IntServer:
    """Answers each turn with a scripted text; ids: one per word, ChatML markers."""

    def __init__(self, url: str = "http://s1") -> None:
        self.url = url
        self.sent: list[list[dict[str, str]]] = []

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [START, ROLE_IDS[m["role"]], *word_ids(m["content"]), END, NEWLINE]
        return ids + [START, ROLE_IDS["assistant"]]

    def answer(self, messages: Sequence[dict[str, str]], text: str,
               finish: str = "stop") -> chain.TurnResult:
        self.sent.append([dict(m) for m in messages])
        prompt = self.prompt_ids(messages)
        sampled = word_ids(text) + ([END] if finish == "stop" else [])
        return chain.TurnResult(text, finish, END if finish == "stop" else None, prompt, sampled,
                                {"prompt_tokens": len(prompt), "completion_tokens": len(sampled)},
                                self.url)


def count_tokens(messages: Sequence[dict[str, str]]) -> int:
    """The IntServer's count of messages rendered as a continuation (generation prompt in)."""
    return sum(len(word_ids(m["content"])) + 4 for m in messages) + 2


def drive(state: chain.ChainState, answers: Sequence[str], server: IntServer | None = None
          ) -> chain.ChainState:
    """Answer each request with the next scripted text until the chain ends or texts run out."""
    server = server or IntServer()
    for text in answers:
        request = chain.next_request(state)
        if isinstance(request, chain.End):
            break
        state = chain.after_turn(state, server.answer(request, text))
    return state


HERMES_SYSTEM = ("You are a function calling AI model. <tools> [get_weather(city), "
                 "get_time(zone)] </tools>")


def hermes_parallel() -> list[dict[str, str]]:
    """System + user; two parallel calls, two tool results; an answer; a follow-up user."""
    return [
        {"role": "system", "content": HERMES_SYSTEM},
        {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
        {"role": "assistant",
         "content": call("get_weather", city="Paris") + "\n" + call("get_time", zone="JST")},
        {"role": "tool", "content": '{"name": "get_weather", "content": "sunny 21C"}'},
        {"role": "tool", "content": '{"name": "get_time", "content": "09:30"}'},
        {"role": "assistant", "content": "Paris is sunny at 21C; it is 09:30 in Tokyo."},
        {"role": "user", "content": "Thanks! Anything else?"},
        {"role": "assistant", "content": "No, that is all."},
    ]


def chat(turns: int) -> list[dict[str, str]]:
    """An Infinity-Instruct-shaped chat: a system turn, then ``turns`` user/assistant pairs."""
    out = [{"role": "system", "content": "You are a helpful assistant."}]
    for k in range(turns):
        out += [{"role": "user", "content": f"question {k} about sql and loops"},
                {"role": "assistant", "content": f"original answer {k}"}]
    return out
