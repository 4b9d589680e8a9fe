"""Filters on a completion's structure: its think block, its answer, its tool calls.

- ``unclosed_think``: a finished turn (``finish_reason: stop``) whose think block never
  closed: the model ended its turn inside its thinking. A cut turn (``length``) is left to the
  ``truncated_completion`` setting: it did not finish, it was stopped.
- ``empty_answer``: a finished turn with nothing but white space after its think block (or,
  thinking off, nothing at all): a drafter would learn to end a turn right after thinking.
- ``invalid_tool_call_json``: a ``<tool_call>`` block (the Hermes function-calling format)
  whose body is not a JSON object with a string ``name`` and object ``arguments`` (a JSON
  string holding an object is accepted too: the OpenAI wire form), or a finished turn that
  opens a block it never closes. Blocks inside fenced code are examples, not calls: skipped.
"""

from __future__ import annotations

import json
import re

from include.quality.parts import Parts

_TOOL_OPEN = "<tool_call>"
_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.DOTALL | re.MULTILINE)


def unclosed_think(parts: Parts) -> str | None:
    """Return why the think block of a finished turn is unclosed, or None."""
    if parts.finish_reason != "stop" or not parts.opened or parts.closed:
        return None
    return (f"finish_reason=stop but no {'</think>'} after {len(parts.text)} characters of "
            "thinking")


def empty_answer(parts: Parts) -> str | None:
    """Return why a finished turn's answer is empty, or None."""
    if parts.finish_reason != "stop" or (parts.opened and not parts.closed):
        return None
    if parts.answer.strip():
        return None
    if parts.closed:
        return f"only white space after </think> ({len(parts.text)} characters of thinking)"
    return "empty completion"


def invalid_tool_call_json(parts: Parts) -> str | None:
    """Return what is wrong with the first bad ``<tool_call>`` block of the answer, or None."""
    if _TOOL_OPEN not in parts.answer:
        return None
    answer = _FENCE.sub("", parts.answer)
    for n, match in enumerate(_TOOL_BLOCK.finditer(answer), 1):
        problem = _call_problem(match.group(1))
        if problem:
            return f"tool call {n}: {problem}"
    tail = _TOOL_BLOCK.sub("", answer)
    if parts.finish_reason == "stop" and _TOOL_OPEN in tail:
        return f"a {_TOOL_OPEN} block is never closed"
    return None


def _call_problem(body: str) -> str | None:
    try:
        call = json.loads(body)
    except ValueError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(call, dict):
        return f"a JSON {type(call).__name__}, not an object"
    if not isinstance(call.get("name"), str) or not call["name"].strip():
        return "no string 'name'"
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return "'arguments' is a string that is not JSON"
    if not isinstance(args, dict):
        return "'arguments' is not an object"
    return None
