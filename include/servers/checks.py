"""Decide whether a running server serves what a run needs, from its ``/v1/models`` answer.

Pure functions over JSON and a few numbers, shared by the launcher (reuse or replace?), the
health trigger (gate) and preflight. ``/v1/models`` is the only place SGLang shows its
effective context length (``max_model_len``), so that is what is compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

#: Prompt length assumed when warning that max_tokens leaves little room for prompts.
TYPICAL_PROMPT_TOKENS = 1024


class Expectation(Protocol):
    """What a served model must match; ``RunSettings`` and ``ModelExpectation`` both fit."""

    @property
    def model_name(self) -> str: ...

    context_length: int
    context_margin: int
    min_completion_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class ModelExpectation:
    """Hold the settings a server is checked against, as JSON-ready data for XCom/triggers."""

    model_name: str
    context_length: int
    context_margin: int = 16
    min_completion_tokens: int = 256
    max_tokens: int = 8192

    @classmethod
    def from_settings(cls, settings: Expectation) -> ModelExpectation:
        """Take the checked fields from ``RunSettings`` (or any object with them)."""
        return cls(
            model_name=settings.model_name,
            context_length=settings.context_length,
            context_margin=settings.context_margin,
            min_completion_tokens=settings.min_completion_tokens,
            max_tokens=settings.max_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data; ``from_dict`` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelExpectation:
        """Build from ``to_dict`` output."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def served_models(models_json: Any) -> list[dict[str, Any]]:
    """Return the model entries of a ``/v1/models`` answer ([] when it has none or is malformed)."""
    if not isinstance(models_json, dict) or not isinstance(models_json.get("data"), list):
        return []
    return [m for m in models_json["data"] if isinstance(m, dict)]


def served_model_differences(models_json: Any, expected: Expectation) -> list[str]:
    """Return how the served model differs from the run's (name, context length); [] if none.

    These are the differences a relaunch fixes; each message names the setting and the fix.
    """
    models = served_models(models_json)
    if not models:
        return [f"/v1/models lists no model (answer: {str(models_json)[:200]!r})"]
    name = expected.model_name
    match = next((m for m in models if m.get("id") == name), None)
    if match is None:
        ids = [m.get("id") for m in models]
        return [
            f"serves model {ids} but this run expects {name!r} (setting `served_model_name`, "
            f"else `model_path`); relaunch it (set `replace_mismatched_servers`: true) or change "
            "the setting to the served name"
        ]
    length = match.get("max_model_len")
    if length != expected.context_length:
        return [
            f"reports max_model_len {length} but setting `context_length` is "
            f"{expected.context_length}; relaunch it with --context-length "
            f"{expected.context_length} (set `replace_mismatched_servers`: true) or set "
            f"`context_length` to {length}"
        ]
    return []


def token_budget_problems(expected: Expectation) -> list[str]:
    """Return why the run's token budget cannot work at this context length; [] if it can.

    ``max_tokens`` >= ``context_length`` is the failure that started this project: SGLang
    rejects every request with prompt + max_tokens >= context length (HTTP 400).
    """
    c, m = expected.context_length, expected.max_tokens
    margin, min_completion = expected.context_margin, expected.min_completion_tokens
    problems: list[str] = []
    room = c - margin - min_completion
    if room <= 0:
        problems.append(
            f"setting `context_length` ({c}) leaves no room for a prompt after `context_margin` "
            f"({margin}) and `min_completion_tokens` ({min_completion}); raise context_length "
            "or lower those"
        )
    if m >= c:
        fit = max(1, c - margin - TYPICAL_PROMPT_TOKENS)
        problems.append(
            f"setting `max_tokens` ({m}) is not below `context_length` ({c}): SGLang rejects a "
            f"request whose prompt + max_tokens reaches {c} tokens; lower max_tokens below "
            f"{c - margin} (e.g. {fit}, leaving {TYPICAL_PROMPT_TOKENS} tokens for a typical "
            f"prompt) or raise context_length to at least {m + margin + TYPICAL_PROMPT_TOKENS}"
        )
    return problems


def token_budget_warnings(
    expected: Expectation, typical_prompt_tokens: int = TYPICAL_PROMPT_TOKENS
) -> list[str]:
    """Return warnings for a budget that works but cuts completions of typical prompts."""
    c, m, margin = expected.context_length, expected.max_tokens, expected.context_margin
    if m >= c or m + typical_prompt_tokens + margin <= c:
        return []
    return [
        f"max_tokens ({m}) + a typical prompt ({typical_prompt_tokens} tokens) + context_margin "
        f"({margin}) exceed context_length ({c}): prompts longer than {c - margin - m} tokens "
        "get fewer than max_tokens completion tokens; lower `max_tokens` or raise "
        "`context_length` if long completions matter"
    ]


def check_served_model(models_json: Any, settings: Expectation) -> list[str]:
    """Return every problem with a server's ``/v1/models`` answer for this run; [] means fine.

    Checks the served name, ``max_model_len`` == ``context_length`` and that the token budget
    (``max_tokens``, ``context_margin``, ``min_completion_tokens``) fits the context length.
    """
    return served_model_differences(models_json, settings) + token_budget_problems(settings)
