"""The reasoning parser of each SGLang release (parser/reasoning_parser.py, serving_chat.py)."""

from __future__ import annotations

import pytest

from sglang_standin import reasoning
from sglang_standin.tokenizer import CHAT_TEMPLATE

RAW = "<think>\nLet me see.\n</think>\n\nThe answer."


def test_v0_5_23_splits_raw_at_the_first_think_end_without_stripping() -> None:
    split = reasoning.split
    assert split("v0.5.23", "qwen3", RAW, False) == ("\nLet me see.\n", "\n\nThe answer.")
    # Leading <think> tags go (repeatedly); later ones stay; the first </think> splits.
    assert split("v0.5.23", "qwen3", "<think><think>a</think>b</think>c", False) == (
        "a", "b</think>c")
    # Cut before </think>: all of it is reasoning, untouched.
    assert split("v0.5.23", "qwen3", "<think>\nhalf a thou", False) == ("\nhalf a thou", "")
    # Qwen3Detector's tool_start_token ends reasoning that never closed; DeepSeek-R1 has none.
    assert split("v0.5.23", "qwen3", "<think>\nx<tool_call>{}", False) == ("\nx", "<tool_call>{}")
    assert split("v0.5.23", "deepseek-r1", "x<tool_call>{}", True) == ("x<tool_call>{}", "")
    # Not forced and no <think>: all normal text.
    assert split("v0.5.23", "qwen3", "plain", False) == ("", "plain")
    assert split("v0.5.23", "qwen3", "plain", True) == ("plain", "")


def test_v0_5_6_strips_think_tags_and_whitespace() -> None:
    split = reasoning.split
    assert split("v0.5.6", "qwen3", RAW, False) == ("Let me see.\n", "The answer.")
    assert split("v0.5.6", "qwen3", "<think>\nhalf a thou ", False) == ("half a thou", "")
    assert split("v0.5.6", "qwen3", "a<think>b</think> c ", False) == ("ab", "c")
    assert split("v0.5.6", "qwen3", " plain ", False) == ("", " plain ")


@pytest.mark.parametrize(
    ("version", "cut_content"), [("v0.5.23", ""), ("v0.5.6", None)]
)
def test_message_fields_follow_serving_chat(version: str, cut_content: str | None) -> None:
    def fields(text: str, separate: bool = True, parser: str | None = "qwen3", **kwargs: object):
        return reasoning.message_fields(version, parser, text, separate, kwargs, CHAT_TEMPLATE)

    content, reasoning_content = fields(RAW)
    assert reasoning_content is not None and "<think>" not in reasoning_content
    assert content == ("\n\nThe answer." if version == "v0.5.23" else "The answer.")
    assert fields("<think>\nhalf") == (cut_content, "\nhalf" if version == "v0.5.23" else "half")
    assert fields(RAW, separate=False) == (RAW, None)
    assert fields(RAW, parser=None) == (RAW, None)
    assert fields("", parser=None) == (cut_content, None)
    # v0.5.23 only: chat_template_kwargs.force_nonempty_content moves reasoning to content.
    moved = fields("<think>\nhalf", force_nonempty_content=True)
    assert moved == (("\nhalf", None) if version == "v0.5.23" else (None, "half"))


def test_force_reasoning_per_release() -> None:
    forced = reasoning.forced
    # The bundled template has an enable_thinking toggle that defaults on.
    assert forced("v0.5.23", "qwen3", {}, CHAT_TEMPLATE)
    assert not forced("v0.5.23", "qwen3", {"enable_thinking": False}, CHAT_TEMPLATE)
    assert not forced("v0.5.6", "qwen3", {}, CHAT_TEMPLATE)  # v0.5.6 wants an explicit true
    assert forced("v0.5.6", "qwen3", {"enable_thinking": True}, CHAT_TEMPLATE)
    for version in ("v0.5.23", "v0.5.6"):
        assert forced(version, "qwen3-thinking", {"enable_thinking": False}, CHAT_TEMPLATE)
        assert forced(version, "deepseek-r1", {"enable_thinking": False}, CHAT_TEMPLATE)
    opens_think = "{{- '<|im_start|>assistant\\n<think>\\n' -}}"
    assert forced("v0.5.6", "qwen3", {"enable_thinking": False}, opens_think)
    assert forced("v0.5.23", "qwen3", {"enable_thinking": False}, opens_think)
    toggled = opens_think + "{% if enable_thinking %}{% endif %}"
    assert not forced("v0.5.23", "qwen3", {"enable_thinking": False}, toggled)
    # A template without a think block still counts as reasoning in v0.5.23 thinking mode.
    assert reasoning.message_fields("v0.5.23", "qwen3", "Hi.", True, {}, "plain") == ("", "Hi.")
    assert reasoning.message_fields("v0.5.6", "qwen3", "Hi.", True, {}, "plain") == ("Hi.", None)


def test_reasoning_tokens_count_through_think_end_in_v0_5_23_only() -> None:
    end = [9]
    ids = [1, 2, 3, 9, 4, 5, 0]
    count = reasoning.reasoning_tokens
    assert count("v0.5.23", "qwen3", {}, ids, end) == 4
    assert count("v0.5.23", "qwen3", {}, [1, 2, 3], end) == 3  # never closed: all of it
    assert count("v0.5.23", "qwen3", {"enable_thinking": False}, ids, end) == 0
    assert count("v0.5.23", None, {}, ids, end) == 0
    assert count("v0.5.23", "qwen3", {}, [1, 7, 8, 2], [7, 8]) == 3
    assert count("v0.5.6", "qwen3", {"enable_thinking": True}, ids, end) == 0
