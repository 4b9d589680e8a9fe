"""The target's control tokens in dataset text: which turn may hold which, read from its tokenizer.

The server applies the chat template to the messages and encodes the result as one string,
so a control token's string inside a message becomes that control token: ``<|im_end|>`` and
``<|im_start|>assistant`` typed by a user end the user's turn and open a forged assistant
turn in the prompt ids, and in ``conversations.jsonl`` a trainer that finds the answer by its
header starts the loss inside the user's text. No request option makes the server read them
as text, and rewriting the user's words to dodge the tokenizer would train the drafter on
text the target never sees. So a row whose turns hold one is dropped at preparation, with
its own funnel reason (``control_token``) and the token and turn in its detail.

Which strings: every added token of the target's tokenizer (``added_tokens_decoder``), none
hard-coded. The template's own markup (the added tokens it writes itself, for tools, tool
results and reasoning: ``<tool_call>``, ``<tool_response>``, ``<think>`` for Qwen3; found by
rendering a probe conversation) stays allowed in system, assistant and tool turns: there it
gives the ids the template gives (Hermes system prompts describe the ``<tool_call>`` format as
Qwen3's tool block does; an earlier assistant turn holds its calls as the template writes
them). A user turn may hold no added token at all, and no turn a special one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: The funnel reason of a row dropped by this rule.
CONTROL_TOKEN = "control_token"
#: Roles whose turns may hold the template's own markup.
MARKUP_ROLES = frozenset({"system", "assistant", "tool"})

# A conversation that makes a chat template write every markup it has: tools in the system
# turn, a tool call and reasoning in an assistant turn, a tool result, thinking switched off.
_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe", "description": "probe", "parameters": {"type": "object", "properties": {}}}}
_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a", "reasoning_content": "r",
     "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {}}}]},
    {"role": "tool", "content": "t"},
]


@dataclass(frozen=True)
class ControlTokens:
    """The target tokenizer's added tokens, and which of them its template writes itself."""

    tokens: tuple[str, ...]  # longest first: a regex alternation then finds the longest
    markup: frozenset[str]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ControlTokens:
        added = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()
                 if t.content}
        written = _template_text(tokenizer)
        markup = frozenset(s for s, special in added.items() if not special and s in written)
        return cls(tuple(sorted(added, key=lambda s: (-len(s), s))), markup)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_firsts", frozenset(s[0] for s in self.tokens))
        object.__setattr__(self, "_any", _alternation(self.tokens))
        object.__setattr__(self, "_non_markup",
                           _alternation([s for s in self.tokens if s not in self.markup]))

    def find(self, role: str, text: str) -> str | None:
        """Return the first control-token string a turn of ``role`` may not hold, or None."""
        # Most texts hold none of the tokens' first characters ('<' for Qwen3): checked in C.
        if not any(ch in text for ch in self._firsts):  # type: ignore[attr-defined]
            return None
        pattern = self._non_markup if role in MARKUP_ROLES else self._any  # type: ignore[attr-defined]
        found = pattern.search(text) if pattern is not None else None
        return found.group() if found else None

    def check(self, turns: list[tuple[str, str]]) -> str | None:
        """Return the drop detail for the first turn holding a forbidden string, or None."""
        for role, text in turns:
            token = self.find(role, text)
            if token is not None:
                return (f"a {role} turn holds {token!r}, a control token of the target's "
                        "tokenizer: the server would read it as that token, not as text")
        return None

    def to_manifest(self) -> dict[str, Any]:
        """Return the rule as the prepare manifest records it."""
        return {"tokens": sorted(self.tokens), "markup_outside_user_turns": sorted(self.markup)}


def _alternation(strings: list[str] | tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(map(re.escape, strings))) if strings else None


def _template_text(tokenizer: Any) -> str:
    """Return what the chat template writes for the probe (less, where it refuses a part)."""
    probes = ((_PROBE, [_PROBE_TOOL]), (_PROBE[:2], [_PROBE_TOOL]), (_PROBE[:2], None))
    for messages, tools in probes:
        try:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                 add_generation_prompt=True, enable_thinking=False)
        except Exception:  # noqa: BLE001, S112 - templates raise anything on what they lack
            continue
    return ""
