"""Chat-template assembly: a completion record in, the sample's texts out, in the template's layout.

Each sample is the prompt exactly as the server rendered it (the chat template with the
generation prompt, ``enable_thinking`` as recorded in the completion's ``sampling``) followed
by the regenerated assistant turn, which is assembled with string operations in the template's
own layout: ``<think>\\nREASONING\\n</think>\\n\\nCONTENT<|im_end|>`` (Qwen3 thinking; without
reasoning the think block is empty and sits outside the loss). The closing ``<|im_end|>`` of a
finished completion is part of the regenerated text: the target emitted that token, and a
drafter that never proposes it cannot predict the end of a turn. The template's trailing
newline after ``<|im_end|>`` is not part of the sample (the server stops at ``<|im_end|>``;
nothing after it was generated). A completion cut by ``max_tokens`` (kept only with
``keep_truncated_completions``) has no closing tags or ``<|im_end|>``: it is what the model
produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from include.tokenization.chat import (
    EMPTY_THINK,
    END_OF_TURN,
    THINK_CLOSE,
    THINK_OPEN,
    ChatTokenizer,
)


@dataclass(frozen=True)
class TokenizeOptions:
    """The settings of the tokenization stage (names as in ``RunSettings``).

    ``enable_thinking`` is used only for records without ``sampling.enable_thinking``.
    """

    include_reasoning: bool = True
    max_sequence_length: int = 32768
    over_length: Literal["drop", "truncate"] = "drop"
    keep_truncated_completions: bool = False
    enable_thinking: bool = True

    def __post_init__(self) -> None:
        if self.over_length not in ("drop", "truncate"):
            raise ValueError(f"over_length must be 'drop' or 'truncate', got {self.over_length!r}")
        if self.max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {self.max_sequence_length}")

    @classmethod
    def from_settings(cls, settings: Any) -> TokenizeOptions:
        """Build options from a ``RunSettings`` (or any object with the same attributes)."""
        return cls(
            include_reasoning=settings.include_reasoning,
            max_sequence_length=settings.max_sequence_length,
            over_length=settings.over_length,
            keep_truncated_completions=settings.keep_truncated_completions,
            enable_thinking=settings.enable_thinking,
        )


@dataclass
class Pending:
    """One record's texts, ready to encode: the prompt as rendered, then the assistant turn."""

    record: Mapping[str, Any]
    id: str
    source: str
    finish_reason: str
    prompt: str
    unmasked_extra: str  # generated-by-template text after the prompt, outside the loss
    assistant: str  # the regenerated text: masked
    conversation: list[dict[str, str]]
    prompt_tokens: int


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def assemble(
    record: Mapping[str, Any], chat: ChatTokenizer, options: TokenizeOptions
) -> Pending | tuple[str, str, str]:
    """Return the texts of one record, or ``(kind, reason, detail)`` when it goes nowhere."""
    finish = record.get("finish_reason")
    messages = record.get("messages")
    usage = record.get("usage") or {}
    if (
        not isinstance(messages, list)
        or not messages
        or not isinstance(usage.get("prompt_tokens"), int)
    ):
        return ("quarantine", "invalid_record", "needs messages and usage.prompt_tokens")
    if finish not in ("stop", "length"):
        return ("quarantine", "unexpected_finish_reason", f"finish_reason={finish!r}")
    if finish == "length" and not options.keep_truncated_completions:
        return ("drop", "truncated_completion", "finish_reason=length")
    content = _text(record.get("content"))
    reasoning = _text(record.get("reasoning_content"))
    sampling = record.get("sampling") or {}
    thinking = sampling.get("enable_thinking", options.enable_thinking) is not False
    for name, text in (("content", content), ("reasoning_content", reasoning)):
        if THINK_OPEN in text or THINK_CLOSE in text:
            return (
                "quarantine",
                "template_mismatch",
                f"{name} contains thinking tags (reasoning not split by the server?)",
            )
    if not thinking and reasoning.strip():
        return (
            "quarantine",
            "template_mismatch",
            "reasoning_content present although enable_thinking=false",
        )
    try:
        prompt = chat.render_prompt(messages, thinking)
    except Exception as exc:  # jinja raises many types for malformed messages
        return ("quarantine", "invalid_record", f"chat template failed: {exc}")
    finished = finish == "stop"
    end = END_OF_TURN if finished else ""
    extra = ""
    if not thinking:
        # The template already put the empty think block into the prompt.
        assistant, shown = content + end, content
    else:
        # Templates that open the think block in the generation prompt leave the model to
        # write only what follows "<think>\n".
        opener = "" if prompt.endswith(THINK_OPEN + "\n") else THINK_OPEN + "\n"
        if not finished and not content:  # cut inside the reasoning: no closing tag exists
            body = reasoning
        else:
            body = reasoning.strip("\n") + "\n" + THINK_CLOSE + "\n\n"
        if options.include_reasoning:
            assistant = opener + body + content + end
            shown = THINK_OPEN + "\n" + body + content
        elif not finished and not content:
            assistant, shown = "", ""  # nothing but reasoning was generated
        else:
            # Not generated as such: the empty think block the template renders sits outside
            # the loss; only the answer is trained on.
            extra = EMPTY_THINK[len(THINK_OPEN + "\n") - len(opener) :]
            assistant, shown = content + end, content
    conversation = [
        {"role": str(m.get("role", "")), "content": _text(m.get("content"))} for m in messages
    ]
    conversation.append({"role": "assistant", "content": shown})
    return Pending(
        record,
        str(record.get("id", "")),
        str(record.get("source", "")),
        finish,
        prompt,
        extra,
        assistant,
        conversation,
        usage["prompt_tokens"],
    )
