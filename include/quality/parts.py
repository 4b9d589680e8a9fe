"""A completion's text split into its thinking and its answer, and the options of the filters.

Pure: plain records in, plain data out. The split is the one SGLang 0.5.23's ``qwen3``
reasoning parser makes of the raw text (``separate_reasoning`` off here, so the server's own
split is not in the record; ``srt/parser/reasoning_parser.py``): with thinking on, the text is
thinking from its first token (any leading ``<think>`` dropped), whether or not the model or
the prompt wrote ``<think>``; it ends at the first ``</think>`` or, with none, at the first
``<tool_call>`` (Qwen3's implicit close); with neither, all of it is thinking and the answer is
empty, as the server counts it (``reasoning_tokens`` = ``completion_tokens``). With thinking
off the template renders the empty think block itself, so the whole text is the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"

#: Every filter, in the order a record meets them (its first failure is its reason). Each
#: name is also the quarantine reason and the value ``quality_filters_off`` accepts.
QUALITY_FILTERS = (
    "degenerate_repetition",
    "unclosed_think",
    "empty_answer",
    "invalid_tool_call_json",
    "near_duplicate",
)


@dataclass(frozen=True)
class QualityOptions:
    """Which filters run and their thresholds (defaults chosen by bench_quality_filters).

    ``check_truncated``: also look at ``finish_reason: length`` records (only worth it when
    they are kept for training); the thinking and answer checks never apply to them, since a
    cut completion has not finished either.
    """

    off: frozenset[str] = frozenset()
    enable_thinking: bool = True
    check_truncated: bool = False
    # degenerate_repetition: a tail that is one span repeated ...
    tail_min_repeats: int = 6
    tail_min_chars: int = 600
    tail_window_chars: int = 8000
    tail_max_period: int = 800
    # ... or, anywhere, a share of repeated word n-grams with one n-gram repeated many times.
    ngram_words: int = 10
    ngram_min_words: int = 200
    ngram_dup_fraction: float = 0.3
    ngram_top_count: int = 12
    ngram_min_distinct: int = 2
    # near_duplicate: word-shingle Jaccard of answers long enough to be a template.
    near_dup_jaccard: float = 0.75
    near_dup_min_words: int = 20
    near_dup_shingle: int = 3

    def __post_init__(self) -> None:
        unknown = sorted(set(self.off) - set(QUALITY_FILTERS))
        if unknown:
            raise ValueError(f"unknown quality filters {unknown}; known: {list(QUALITY_FILTERS)}")

    def on(self, name: str) -> bool:
        """Return whether filter ``name`` runs."""
        return name not in self.off


@dataclass(frozen=True)
class Parts:
    """A record's text as the filters read it."""

    id: str
    finish_reason: str
    text: str
    thinking: bool  # the request asked for thinking
    opened: bool  # the text starts inside a think block (thinking on)
    closed: bool  # ... which ended: at `</think>`, or at a `<tool_call>` with no `</think>`
    answer: str  # what follows the think block (all of the text with thinking off)
    prompt_key: str  # the prompt's user turns, white space folded (tells prompts apart)


def parts_of(record: Mapping[str, Any], options: QualityOptions) -> Parts | None:
    """Return the parts of a record the filters may judge; None for one they must not.

    Not judged (left to the tokenization checks, which give the precise reason): a record
    without raw text, with another finish reason than stop/length, a cut one unless
    ``check_truncated``, and thinking tags in a thinking-off record (``template_mismatch``).
    """
    text = record.get("text")
    finish = record.get("finish_reason")
    if not isinstance(text, str) or finish not in ("stop", "length"):
        return None
    if finish == "length" and not options.check_truncated:
        return None
    sampling = record.get("sampling")
    requested = sampling.get("enable_thinking") if isinstance(sampling, Mapping) else None
    thinking = (options.enable_thinking if requested is None else requested) is not False
    if not thinking and (THINK_OPEN in text or THINK_CLOSE in text):
        return None
    opened, closed, answer = thinking, False, text
    if thinking:
        cut = text.find(THINK_CLOSE)
        if cut >= 0:
            closed, answer = True, text[cut + len(THINK_CLOSE):]
        elif (cut := text.find(TOOL_OPEN)) >= 0:
            closed, answer = True, text[cut:]
        else:
            answer = ""
    return Parts(str(record.get("id", "")), str(finish), text, thinking, opened, closed,
                 answer, _prompt_key(record.get("messages")))


def _prompt_key(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    turns = [str(m.get("content") or "") for m in messages
             if isinstance(m, Mapping) and m.get("role") == "user"]
    return " ".join(" ".join(turns).split())
