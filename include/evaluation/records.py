"""One measured request: the journaled record of a drafter configuration answering one prompt.

A record is written once per (configuration, prompt, temperature, thinking mode): its ``id``
joins them, so the durability journal's rule (first final record per id; a retryable failure
is redone) makes a measurement resumable exactly as generation is. The acceptance figures are
the server's own (``sglext.spec_tokens_details``, SGLang 0.5.23 ``tokenizer_manager.py``
``_calculate_spec_decoding_metrics``), never recomputed from text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from include.outcomes import ErrorKind, PromptStatus
from include.sglang.contract import Answer

#: The configuration label of the pass without a drafter (the speedup's denominator).
TARGET_ONLY = "target-only"
#: The ``source`` of a deployment's named prompt set's prompts (``prompt_sets``): a prefix no
#: run source has (their names are lowercase letters, digits, '_' and '-'), so a set's rows
#: never pass for the run's own data.
SET_SOURCE_PREFIX = "set:"


def is_named_set(source: str) -> bool:
    """Whether ``source`` is a deployment's named prompt set, not the run's data."""
    return source.startswith(SET_SOURCE_PREFIX)


@dataclass(frozen=True)
class Condition:
    """What one pass varies: the drafter configuration, temperature and thinking mode."""

    config: str
    temperature: float
    thinking: bool

    def key(self, prompt_id: str) -> str:
        """The journal id of this condition's request for ``prompt_id``."""
        mode = "think" if self.thinking else "nothink"
        return f"{self.config}|t={self.temperature:g}|{mode}|{prompt_id}"


def request_body(prompt: dict[str, Any], cond: Condition, model: str,
                 max_tokens: int) -> dict[str, Any]:
    """The chat request for one held-out prompt under ``cond``, asking for spec details."""
    return {
        "model": model,
        "messages": prompt["messages"],
        "max_tokens": max_tokens,
        "temperature": cond.temperature,
        "chat_template_kwargs": {"enable_thinking": cond.thinking},
        "return_spec_tokens_details": True,
    }


def _failure_reason(answer: Answer) -> str:
    if not answer.answered:
        return str(answer.failure)
    if answer.status == 503:
        return ErrorKind.QUEUE_FULL.value
    if answer.status is not None and answer.status >= 500:
        return ErrorKind.HTTP_5XX.value
    return ErrorKind.HTTP_4XX.value


def record_from_answer(prompt: dict[str, Any], cond: Condition, answer: Answer,
                       latency_s: float) -> dict[str, Any]:
    """Return the journal record of one answer (a failure keeps its reason and status)."""
    base: dict[str, Any] = {
        "id": cond.key(prompt["id"]), "prompt_id": prompt["id"],
        "source": prompt.get("source", ""), "config": cond.config,
        "temperature": cond.temperature, "thinking": cond.thinking,
    }
    if prompt.get("prompt_set"):  # a deployment's named set: reported apart from the run's data
        base["prompt_set"] = prompt["prompt_set"]
    if not answer.answered or answer.status != 200:
        return {**base, "status": PromptStatus.FAILED.value, "reason": _failure_reason(answer),
                "http_status": answer.status, "error": answer.text()[:300]}
    try:
        body = answer.json()
        tokens = int(body["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return {**base, "status": PromptStatus.FAILED.value,
                "reason": ErrorKind.BAD_RESPONSE.value, "http_status": 200}
    spec = (body.get("sglext") or {}).get("spec_tokens_details")
    if isinstance(spec, list):  # n > 1 answers a list; one choice is asked for
        spec = spec[0] if spec else None
    return {
        **base, "status": PromptStatus.COMPLETED.value, "completion_tokens": tokens,
        "latency_s": round(latency_s, 6), "finish_reason": body["choices"][0]["finish_reason"],
        "spec": _spec_fields(spec),
    }


def _spec_fields(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(spec, dict):
        return None  # no verify pass (a one-token answer) or no speculation
    return {
        "accept_length": float(spec.get("spec_accept_length") or 0.0),
        "accept_rate": float(spec.get("spec_accept_rate") or 0.0),
        "verify_ct": int(spec.get("spec_verify_ct") or 0),
        "num_correct_drafts": int(spec.get("spec_num_correct_drafts") or 0),
        "num_proposed_drafts": int(spec.get("spec_num_proposed_drafts") or 0),
        "histogram": list(spec.get("spec_correct_drafts_histogram") or []),
    }


def completed(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The completed records, in a stable order (by id)."""
    return [records[k] for k in sorted(records)
            if records[k].get("status") == PromptStatus.COMPLETED.value]
