"""SGLang's native `/generate`: the request (`managers/io_struct.py` `GenerateReqInput`) and the
answer `{"text", "output_ids", "meta_info"}` (`tokenizer_manager.py` `_handle_batch_output`)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang_standin.errors import VALIDATION, BadRequest
from sglang_standin.generation import Completion, detokenize


@dataclass
class GenerateRequest:
    """Hold the fields of one /generate request the stand-in acts on."""

    text: str | None
    input_ids: list[int] | None
    max_new_tokens: int | None = None
    skip_special_tokens: bool = True
    # Everything else in sampling_params: it seeds the completion.
    sampling: dict[str, Any] = field(default_factory=dict)


def parse_generate(body: Any) -> GenerateRequest:
    """Validate a /generate body; raise BadRequest as SGLang would."""
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", VALIDATION)
    text = body.get("text")
    input_ids = body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("Either text or input_ids should be provided.", VALIDATION)
    if text is not None and not isinstance(text, str):
        raise BadRequest("the stand-in models a single text prompt per request", VALIDATION)
    if input_ids is not None and not (
        isinstance(input_ids, list) and all(isinstance(t, int) for t in input_ids)
    ):
        raise BadRequest("the stand-in models a single input_ids list per request", VALIDATION)
    if body.get("stream"):
        raise BadRequest("the stand-in does not model streaming", VALIDATION)
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise BadRequest("sampling_params: Input should be a valid dictionary", VALIDATION)
    max_new = sampling.get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise BadRequest("max_new_tokens must be a non-negative integer", VALIDATION)
    # A detokenizer option, not a sampling one: it must not change what is sampled.
    skip = sampling.get("skip_special_tokens", True) is not False
    rest = {k: v for k, v in sampling.items() if k not in ("max_new_tokens", "skip_special_tokens")}
    return GenerateRequest(text, input_ids, max_new, skip, rest)


def generate_body(
    tokenizer: Any,
    req: GenerateRequest,
    completion: Completion,
    prompt_tokens: int,
    cached_tokens: int,
    arrived: float,
) -> dict[str, Any]:
    """Return the /generate answer; `cached_tokens` is reported whatever the cache-report flag."""
    if completion.finish == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": completion.matched_stop}
    else:
        finish = {"type": "length", "length": completion.completion_tokens}
    text = completion.text
    if not req.skip_special_tokens:
        text = detokenize(tokenizer, completion.ids, completion.matched_stop, False)
    return {
        "text": text,
        "output_ids": completion.ids,
        "meta_info": {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "cached_tokens": cached_tokens,
            "weight_version": "default",
            "e2e_latency": time.monotonic() - arrived,
        },
    }
