"""The stand-in's tool calls (``--standin-tool-call-rate``): when, what, and as which ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sglang_standin.generation import first_tool_name
from sglang_standin.testing import ThreadServer, call

ServerFactory = Callable[..., ThreadServer]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {}}}]
SYSTEM = ("You are a function calling AI model. You are provided with function signatures "
          f"within <tools></tools> XML tags. <tools> {json.dumps(TOOLS)} </tools>")


def _ask(server: ThreadServer, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "separate_reasoning": False,
            "return_token_ids": True, "skip_special_tokens": False}
    return call("POST", server.url + "/v1/chat/completions", body).json()["choices"][0]


def test_a_prompt_offering_tools_gets_a_call_to_the_first_then_prose_after_its_result(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    server = make_server(standin_tool_call_rate=1.0)
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Rain?"}]
    first = _ask(server, turns)
    text = first["message"]["content"]
    body = text.split("<tool_call>")[1].split("</tool_call>")[0]
    assert json.loads(body) == {"name": "get_weather", "arguments": {}}
    assert text.index("</think>") < text.index("<tool_call>")
    # The ids are the tokenizer's own for that text (+ the stop token), as for prose.
    ids = first["response_token_ids"]
    assert ids[:-1] == tokenizer.encode(text, add_special_tokens=False)
    answered = [*turns, {"role": "assistant", "content": text},
                {"role": "tool", "content": '{"rain": false}'}]  # fmt: skip
    assert "<tool_call>" not in _ask(server, answered)["message"]["content"]


@pytest.mark.parametrize("rate", [0.0, 0.5])
def test_the_rate_is_the_share_of_prompts_that_call(make_server: ServerFactory, rate: float
                                                     ) -> None:
    server = make_server(standin_tool_call_rate=rate)
    calls = sum("<tool_call>" in _ask(server, [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": f"q{i}"}]
                                      )["message"]["content"] for i in range(60))
    assert (calls == 0) if rate == 0 else 15 <= calls <= 45
    plain = [{"role": "user", "content": "no tools here"}]
    assert "<tool_call>" not in _ask(make_server(standin_tool_call_rate=1.0), plain)[
        "message"]["content"]


def test_tool_names_are_read_from_hermes_and_qwen_blocks() -> None:
    assert first_tool_name(SYSTEM) == "get_weather"
    lines = "\n".join(json.dumps(t) for t in reversed(TOOLS))
    assert first_tool_name(f"# Tools\n<tools>\n{lines}\n</tools>") == "get_time"
    assert first_tool_name("<tools> not json </tools>") is None
    assert first_tool_name("no block") is None
