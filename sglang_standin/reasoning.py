"""Split generated text into reasoning and answer as each SGLang release does.

Where the releases differ (the reason `--standin-version` exists):

* v0.5.23, `parser/reasoning_parser.py` `BaseReasoningFormatDetector._detect_and_parse_impl`:
  leading `<think>` tags are stripped (repeatedly), the rest is split at the first `</think>`
  with no whitespace stripped; without `</think>` everything is reasoning, unless a
  `<tool_call>` (Qwen3Detector's `tool_start_token`) ends it early. `serving_chat.py`
  `_build_chat_response`: `content=text if text else ""`,
  `reasoning_content=reasoning_text if reasoning_text else None`.
* v0.5.6, `parser/reasoning_parser.py` `BaseReasoningFormatDetector.detect_and_parse`:
  `text.replace("<think>", "").strip()`, then the split, the answer `.strip()`ped;
  `serving_chat.py` `_build_chat_response`: `content=text if text else None`.

Whether a text without `<think>` counts as reasoning ("force_reasoning") follows each
release's `serving_chat.py` too (see `forced`).
"""

from __future__ import annotations

import re
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_START = "<tool_call>"
#: Parsers the stand-in models; all three use `<think>`/`</think>`.
PARSERS = ("qwen3", "qwen3-thinking", "deepseek-r1")
# `template_manager.py` / `template_detection.py`: a template whose generation prompt opens
# the think block makes every answer reasoning until `</think>`.
_FORCE_PATTERN = re.compile(r"<\|im_start\|>assistant\\n<think>\\n")


def thinking_mode(version: str, parser: str | None, template_kwargs: dict[str, Any]) -> bool:
    """Say whether the request runs in thinking mode.

    v0.5.23 `serving_chat.py` `_get_reasoning_from_request`: on unless
    `enable_thinking` is false (the bundled template's toggle defaults on, and so does
    Qwen3Detector's `reasoning_default` when no toggle is detected). v0.5.6
    `_get_enable_thinking_from_request`: only an explicit true `enable_thinking`, qwen3 only.
    """
    if parser not in PARSERS:
        return False
    if version == "v0.5.6":
        return parser == "qwen3" and bool(template_kwargs.get("enable_thinking", False))
    return template_kwargs.get("enable_thinking") is not False


def forced(version: str, parser: str, template_kwargs: dict[str, Any], template: str) -> bool:
    """Say whether the parser treats the text as reasoning even without a `<think>`.

    `force_reasoning = template_manager.force_reasoning or <thinking mode>`
    (`serving_chat.py` `_build_chat_response`, both releases); `ReasoningParser.__init__`
    forces qwen3-thinking and `DeepSeekR1Detector` forces itself.
    """
    if parser in ("qwen3-thinking", "deepseek-r1"):
        return True
    template_forces = _FORCE_PATTERN.search(template) is not None
    if version != "v0.5.6":
        # v0.5.23's rule "force_reasoning_pattern" also wants no toggle in the template.
        template_forces = template_forces and "thinking" not in template
    return template_forces or thinking_mode(version, parser, template_kwargs)


def split(version: str, parser: str, text: str, force: bool) -> tuple[str, str]:
    """Return (reasoning_text, normal_text) as the release's detector does ("" for none)."""
    if not (force or THINK_START in text):
        return "", text
    if version == "v0.5.6":
        processed = text.replace(THINK_START, "").strip()
        if THINK_END not in processed:
            return processed, ""
        reasoning, normal = processed.split(THINK_END, 1)
        return reasoning, normal.strip()
    processed = text
    while processed.startswith(THINK_START):
        processed = processed[len(THINK_START) :]
    if THINK_END not in processed:
        tool = processed.find(TOOL_START) if parser != "deepseek-r1" else -1
        if tool != -1:
            return processed[:tool], processed[tool:]
        return processed, ""
    reasoning, normal = processed.split(THINK_END, 1)
    return reasoning, normal


def message_fields(
    version: str,
    parser: str | None,
    text: str,
    separate_reasoning: bool,
    template_kwargs: dict[str, Any],
    template: str,
) -> tuple[str | None, str | None]:
    """Return the message's (content, reasoning_content) for generated `text`."""
    reasoning = ""
    if parser in PARSERS and separate_reasoning:
        force = forced(version, parser, template_kwargs, template)
        reasoning, text = split(version, parser, text, force)
        # v0.5.23 `BaseReasoningFormatDetector._maybe_apply_force_nonempty_content`.
        nonempty = version != "v0.5.6" and template_kwargs.get("force_nonempty_content") is True
        if nonempty and not text:
            text, reasoning = reasoning, text
    if version == "v0.5.6":
        return (text or None), (reasoning or None)
    return text, (reasoning or None)


def reasoning_tokens(
    version: str,
    parser: str | None,
    template_kwargs: dict[str, Any],
    ids: list[int],
    think_end_ids: list[int],
) -> int:
    """Return usage.reasoning_tokens: v0.5.23 counts sampled ids through the end of
    `</think>` (all of them if it never came) in thinking mode (`managers/schedule_batch.py`
    `Req.update_reasoning_tokens`); v0.5.6 reports 0."""
    if version == "v0.5.6" or not think_end_ids:
        return 0
    if not thinking_mode(version, parser, template_kwargs):
        return 0
    n = len(think_end_ids)
    for i in range(len(ids) - n + 1):
        if ids[i : i + n] == think_end_ids:
            return i + n
    return len(ids)
