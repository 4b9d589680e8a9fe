"""A completion record in, the parts of its sample out: the server's ids, or the raw text.

The server is the authority. A record from a server that returned its token ids (SGLang >=
0.5.23 with ``return_token_ids``) becomes exactly those ids: the prompt as the server
tokenized it, then the ids it sampled, through the stop token it matched (``<|im_end|>``: a
drafter that never proposes it cannot predict the end of a turn). A record from an older
server carries only the raw generated text (``separate_reasoning`` off, so the thinking block
is inline and no release's whitespace rules are involved); its sample is the prompt rendered
by the run's tokenizer and the text encoded, and ``checks`` counts it and compares what it can
against the server's own counts. Nothing is rebuilt from a reasoning/answer split.

``include_reasoning: false`` keeps the thinking out of the sample: the template's empty think
block (derived from the template itself) stands in the prompt, outside the loss, and only what
the model sampled after its ``</think>`` is trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from include.tokenization.chat import THINK_CLOSE, THINK_OPEN, ChatTokenizer

#: Where a sample's ids come from: the server's ids, or the raw text encoded here.
TokenSource = Literal["server", "text"]


@dataclass(frozen=True)
class TokenizeOptions:
    """The settings of the tokenization stage (names as in ``RunSettings``).

    ``enable_thinking`` is used only for records without ``sampling.enable_thinking``.
    ``quality_filters_off`` names the output quality filters (``include.quality``) not run.
    """

    include_reasoning: bool = True
    max_sequence_length: int = 32768
    over_length: Literal["drop", "truncate"] = "drop"
    keep_truncated_completions: bool = False
    enable_thinking: bool = True
    quality_filters_off: frozenset[str] = frozenset()

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
            quality_filters_off=frozenset(getattr(settings, "quality_filters_off", None) or ()),
        )


@dataclass
class Pending:
    """One record's parts, ready to encode and check.

    ``prompt_ids``/``sampled_ids`` are the server's (None on the text path). ``text`` is the
    raw generated text as the server decoded it; ``trained_text`` the part the loss covers
    (all of it, or what follows ``</think>``), ``skip_ids`` how many sampled ids precede that
    part. ``stop_id`` is the sampled stop token that ends the turn, if any.
    """

    record: Mapping[str, Any]
    id: str
    source: str
    finish_reason: str
    token_source: TokenSource
    prompt: str  # the prompt as the run's tokenizer renders it
    unmasked_extra: str  # template text after the prompt, outside the loss
    text: str
    trained_text: str
    prompt_ids: list[int] | None
    sampled_ids: list[int] | None
    stop_id: int | None
    prompt_tokens: int
    completion_tokens: int | None
    conversation: list[dict[str, Any]]


#: The key ``conversations.explode`` sets on a message the target generated in this run.
GENERATED_MARK = "_generated_by_target"


def _ids(value: Any) -> list[int] | None:
    # Exactly int (a JSON true is a bool, an int subclass); map/set keep the check in C.
    if isinstance(value, list) and set(map(type, value)) <= {int}:
        return value
    return None


def assemble(
    record: Mapping[str, Any], chat: ChatTokenizer, options: TokenizeOptions
) -> Pending | tuple[str, str, str]:
    """Return the parts of one record, or ``(kind, reason, detail)`` when it goes nowhere."""
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
    text = record.get("text")
    if not isinstance(text, str):
        return (
            "quarantine",
            "no_raw_text",
            "no raw generated text: written by a version that kept only the server's "
            "reasoning/answer split, which cannot be joined back exactly; regenerate the "
            "shard (force_regenerate)",
        )
    prompt_ids = _ids(record.get("prompt_token_ids"))
    sampled = _ids(record.get("response_token_ids"))
    if (prompt_ids is None) != (sampled is None):
        return ("quarantine", "server_ids_mismatch", "only one of prompt/response token ids")
    completion = usage.get("completion_tokens")
    if sampled is not None and prompt_ids is not None and (
        len(prompt_ids) != usage["prompt_tokens"]
        or (isinstance(completion, int) and len(sampled) != completion)
    ):
        return ("quarantine", "server_ids_mismatch",
                f"{len(prompt_ids)} prompt and {len(sampled)} sampled ids, but the server's "
                f"usage counts {usage['prompt_tokens']} and {completion}")
    sampling = record.get("sampling") or {}
    thinking = sampling.get("enable_thinking", options.enable_thinking) is not False
    if not thinking and (THINK_OPEN in text or THINK_CLOSE in text):
        return ("quarantine", "template_mismatch",
                "thinking tags in the text although enable_thinking=false")
    try:
        prompt = chat.render_prompt(messages, thinking)
    except Exception as exc:  # jinja raises many types for malformed messages
        return ("quarantine", "invalid_record", f"chat template failed: {exc}")
    stop_id = _stop_id(record, sampled, chat, finish)
    opened = chat.opens_thinking(prompt)
    extra, trained_text, skip = "", text, 0
    if thinking and not options.include_reasoning:
        split = _after_reasoning(text, sampled, chat, opened)
        if split is None:
            return ("quarantine", "mask_all_zero",
                    "nothing but reasoning was generated (no </think>)")
        trained_text, skip = split
        try:
            extra = chat.empty_think_closing()
        except Exception as exc:  # the template cannot render thinking off
            return ("quarantine", "template_mismatch", str(exc))
    shown = (THINK_OPEN + "\n" if opened else "") + text if options.include_reasoning \
        else trained_text.lstrip("\n")
    # ``generated`` only where the tokenization stage itself marked a message as the
    # target's (a whole conversation's earlier turns, ``conversations.explode``): a record's
    # own ``messages`` are the dataset's, whatever keys they carry.
    conversation = [
        {"role": str(m.get("role", "")), "content": m.get("content") or "",
         "generated": m.get(GENERATED_MARK) is True} for m in messages
    ]
    conversation.append({"role": "assistant", "content": shown, "generated": True})
    return Pending(
        record, str(record.get("id", "")), str(record.get("source", "")), finish,
        "server" if sampled is not None else "text", prompt, extra, text, trained_text,
        prompt_ids, sampled[skip:] if sampled is not None else None, stop_id,
        usage["prompt_tokens"], completion if isinstance(completion, int) else None,
        conversation,
    )  # fmt: skip


def _stop_id(
    record: Mapping[str, Any], sampled: Sequence[int] | None, chat: ChatTokenizer, finish: str
) -> int | None:
    """Return the stop token that ended a finished turn: the server's, or the template's."""
    if finish != "stop":
        return None
    matched = record.get("matched_stop")
    if sampled:
        # SGLang returns ids through the stop token it matched.
        return sampled[-1] if sampled[-1] == matched or sampled[-1] in chat.stop_ids else None
    return matched if type(matched) is int else chat.end_of_turn_id


def _after_reasoning(
    text: str, sampled: Sequence[int] | None, chat: ChatTokenizer, opened: bool
) -> tuple[str, int] | None:
    """Return (text after the first ``</think>``, sampled ids through it); None: none there.

    With no think block at all (none opened by the prompt or the model) the model answered
    at once: all of it is the answer.
    """
    if THINK_CLOSE not in text:
        return None if opened or THINK_OPEN in text else (text, 0)
    after = text.split(THINK_CLOSE, 1)[1]
    if sampled is None:
        return after, 0
    try:
        return after, sampled.index(chat.think_close_id) + 1
    except ValueError:
        return None
