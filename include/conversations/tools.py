"""Tool calls and agent actions: which calls a turn made, and whether two turns made the same.

A recorded tool result (a Hermes ``tool`` turn, an agent's observation) is the answer to the
original assistant turn's calls; it may follow a regenerated turn only when the target made
exactly those calls. Calls are compared as multisets of normalised calls, so parallel calls
in another order pair, and a missing, extra or changed call does not.

Two formats, chosen per source (``CALL_FORMATS``):

* ``tool_call``: Hermes / Qwen3 ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  blocks, as SGLang's Qwen parser reads them; ``arguments`` may be an object or a JSON string
  holding one. Normalised to canonical JSON (sorted keys, integral floats as ints).
* ``agent_action``: AgentInstruct-style ``Act: <name>`` / ``Action: <name>`` lines, each with
  the first fenced block after it (before the next action line; none: an empty argument) as
  its argument, white space folded. Any fence form reads the same: ```` ``` ```` or ``~~~``,
  three or more, a language tag or none, the block on its own lines or on one line
  (```` ```ls /etc``` ````), or opened on the action line itself. A fence never closed makes
  the turn's actions unreadable (so nothing pairs with it).

Only the answer part of a turn counts: a call written inside the thinking block is not one.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

#: The call formats a chain can be started with.
CALL_FORMATS = ("tool_call", "agent_action")

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_ACTION = re.compile(r"^[ \t]*(?:Act|Action):[ \t]*(.*?)[ \t]*$", re.M)
_FENCE_OPEN = re.compile(r"`{3,}|~{3,}")
#: An info string read as a language tag (dropped) when the block has a body below it.
_LANGUAGE_TAG = re.compile(r"[\w+#.-]+")
_THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class Calls:
    """The calls one turn made, normalised and sorted; ``error`` set when they cannot be read."""

    calls: tuple[str, ...] = ()
    error: str = ""

    @property
    def valid(self) -> bool:
        """Return whether every call in the turn could be read."""
        return not self.error


@dataclass(frozen=True)
class Pairing:
    """Whether a regenerated turn made the original turn's calls, and if not, why."""

    paired: bool
    detail: str = ""


def answer_part(text: str) -> str:
    """Return the text after the first ``</think>`` (all of it when there is none), as
    ``tokenization.assembly`` splits it."""
    return text.split(_THINK_CLOSE, 1)[1] if _THINK_CLOSE in text else text


def _canonical(value: Any) -> Any:
    # 2 and 2.0 are the same argument to a tool; json.dumps would write them apart.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _load(body: str, lenient: bool) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        if not lenient:
            raise
    # Hermes Function Calling v1 records its own calls as Python dict reprs (single quotes);
    # only the dataset's side is read this way, the target must write JSON as its parser needs.
    try:
        return ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise json.JSONDecodeError("neither JSON nor a Python literal", body, 0) from None


def _one_tool_call(body: str, lenient: bool) -> str:
    obj = _load(body.strip(), lenient)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError("a call needs an object with a string 'name'")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        args = _load(args, lenient) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError(f"'arguments' of {obj['name']!r} is not an object")
    call = {"name": obj["name"], "arguments": _canonical(args)}
    return json.dumps(call, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tool_calls(text: str, *, lenient: bool = False) -> Calls:
    """Return the ``<tool_call>`` blocks of a turn's answer, normalised.

    ``lenient`` also reads Python-literal calls (the dataset's own turns). An unclosed block
    (a call cut off) or one that is not a named call makes the result invalid.
    """
    answer = answer_part(text)
    found = []
    for i, match in enumerate(_TOOL_CALL.finditer(answer)):
        try:
            found.append(_one_tool_call(match.group(1), lenient))
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            return Calls(error=f"call {i + 1} is not a valid call ({exc})")
    if answer.count("<tool_call>") != len(found) or answer.count("</tool_call>") != len(found):
        return Calls(error="a <tool_call> block is not closed")
    return Calls(tuple(sorted(found)))


def agent_actions(text: str, *, lenient: bool = False) -> Calls:
    """Return the ``Act:``/``Action:`` lines of a turn's answer, each with its fenced block.

    An action line inside a fenced block is the block's text, not an action.
    """
    del lenient  # one reading for both sides: actions are plain text
    answer = answer_part(text)
    found = []
    at = 0
    while (action := _ACTION.search(answer, at)) is not None:
        line = action.group(1)
        opener = _FENCE_OPEN.search(line)
        name = " ".join((line[:opener.start()] if opener else line).split())
        following = _ACTION.search(answer, action.end())
        limit = following.start() if following else len(answer)
        fence = _FENCE_OPEN.search(answer, action.start(1) + opener.start() if opener
                                   else action.end(), limit)
        code, at = "", action.end()
        if fence is not None:
            read = _fenced(answer, fence)
            if read is None:
                return Calls(error=f"the fenced block of action {name!r} is not closed")
            code, at = read
        found.append(json.dumps([name, " ".join(code.split())], ensure_ascii=False))
    return Calls(tuple(sorted(found)))


def _fenced(text: str, opener: re.Match[str]) -> tuple[str, int] | None:
    """Return a fenced block's text and where it ends (None: never closed). The block closes
    at the first run of its fence character as long as its opener, on its line or later."""
    run = opener.group()
    close = re.compile(re.escape(run[0]) + "{" + str(len(run)) + ",}")
    line_end = text.find("\n", opener.end())
    line_end = len(text) if line_end < 0 else line_end
    same_line = close.search(text, opener.end(), line_end)
    if same_line is not None:  # ```ls /etc```: one line, no language tag to read
        return text[opener.end():same_line.start()], same_line.end()
    end = close.search(text, line_end)
    if end is None:
        return None
    info, body = text[opener.end():line_end].strip(), text[line_end + 1:end.start()]
    if body.strip() and (not info or _LANGUAGE_TAG.fullmatch(info)):
        return body, end.end()
    # ```ls /etc then a closing fence: the opening line holds the command, not a language.
    return f"{info}\n{body}", end.end()


_READERS = {"tool_call": tool_calls, "agent_action": agent_actions}


def calls_of(text: str, call_format: str, *, lenient: bool = False) -> Calls:
    """Return the calls of ``text`` in ``call_format`` (one of ``CALL_FORMATS``)."""
    try:
        reader = _READERS[call_format]
    except KeyError:
        raise ValueError(f"unknown call format {call_format!r}; one of {CALL_FORMATS}") from None
    return reader(text, lenient=lenient)


def pair_calls(
    original: str, regenerated: str, call_format: str, *, results_follow: bool
) -> Pairing:
    """Return whether the regenerated turn made the original turn's calls, all of them.

    ``results_follow``: the dataset's next turn is a tool result (or observation), which
    needs at least one call to answer. Without one, the two turns must both make no call or
    the same calls (a call the dataset never answered cannot be continued from).
    """
    ours = calls_of(regenerated, call_format)
    theirs = calls_of(original, call_format, lenient=True)
    if not theirs.valid:
        return Pairing(False, f"the original turn's calls cannot be read: {theirs.error}")
    if not ours.valid:
        return Pairing(False, f"the regenerated turn's calls cannot be read: {ours.error}")
    if results_follow and not theirs.calls:
        return Pairing(False, "a tool result follows an original turn that made no call")
    if ours.calls == theirs.calls:
        return Pairing(True)
    if not ours.calls:
        return Pairing(False, f"no call where the original made {len(theirs.calls)}")
    if not theirs.calls:
        return Pairing(False, f"{len(ours.calls)} call(s) where the original made none")
    missing = _minus(theirs.calls, ours.calls)
    extra = _minus(ours.calls, theirs.calls)
    return Pairing(False, f"calls differ: {len(missing)} of the original's not made "
                          f"({', '.join(missing)[:200]}), {len(extra)} other(s) made "
                          f"({', '.join(extra)[:200]})")


_RESPONSE = re.compile(r"\A\s*<tool_response>\s*(.*?)\s*</tool_response>\s*\Z", re.S)


def unwrap_tool_response(content: str) -> str:
    """Return a tool turn's content without one enclosing ``<tool_response>`` block.

    Hermes records its ``tool`` turns wrapped; Qwen3's template (and the stand-in's) wraps a
    ``tool`` message itself, so a wrapped one would reach the model wrapped twice. Content
    with several blocks (one combined result of parallel calls) or none is returned as is.
    """
    match = _RESPONSE.match(content)
    if match is None or "<tool_response>" in match.group(1):
        return content
    return match.group(1)


def _minus(a: tuple[str, ...], b: tuple[str, ...]) -> list[str]:
    rest = list(b)
    out = []
    for item in a:
        if item in rest:
            rest.remove(item)
        else:
            out.append(item)
    return out
