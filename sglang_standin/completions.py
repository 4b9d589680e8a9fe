"""/v1/completions: a raw prompt in, SGLang 0.5.23's ``text_completion`` answer out.

Request fields follow ``entrypoints/openai/protocol.py`` ``CompletionRequest`` (``max_tokens``
defaults to 16 there); the answer follows ``serving_completions.py``: with
``return_token_ids`` each choice carries ``token_ids`` (the sampled ids) and
``prompt_token_ids``, names that differ from the chat answer's ``response_token_ids``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang_standin.errors import VALIDATION, BadRequest
from sglang_standin.generation import Completion

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop")


@dataclass
class CompletionRequest:
    """The fields of one completion request the stand-in acts on."""

    prompt: str
    max_tokens: int = 16
    model: str = "default"
    return_token_ids: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)


def parse_completion(body: Any) -> CompletionRequest:
    """Validate a completion body; raise BadRequest for what SGLang or the stand-in refuses."""
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", VALIDATION)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("the stand-in models a prompt that is one string", VALIDATION)
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise BadRequest("max_tokens: Input should be a valid integer", VALIDATION)
    if body.get("stream"):
        raise BadRequest("the stand-in does not model streaming", VALIDATION)
    return CompletionRequest(
        prompt=prompt, max_tokens=max_tokens, model=str(body.get("model", "default")),
        return_token_ids=body.get("return_token_ids") is True,
        sampling={k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None})


def completion_body(req: CompletionRequest, completion: Completion,
                    prompt_ids: list[int]) -> dict[str, Any]:
    """Return the ``text_completion`` JSON for one answer."""
    choice: dict[str, Any] = {
        "index": 0, "text": completion.text, "logprobs": None,
        "finish_reason": completion.finish, "matched_stop": completion.matched_stop,
    }
    if req.return_token_ids:
        choice["token_ids"] = completion.ids
        choice["prompt_token_ids"] = prompt_ids
    p, n = len(prompt_ids), completion.completion_tokens
    return {
        "id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
        "model": req.model, "choices": [choice],
        "usage": {"prompt_tokens": p, "total_tokens": p + n, "completion_tokens": n,
                  "prompt_tokens_details": None, "reasoning_tokens": 0,
                  "completion_tokens_details": None},
        "metadata": {"weight_version": "default"},
    }
