"""/v1/chat/completions: read the body as SGLang's pydantic model would, and write the answer.

Request fields follow `entrypoints/openai/protocol.py` `ChatCompletionRequest`; unknown fields
are ignored there, which is how v0.5.6 treats `return_token_ids`. The answer follows
`serving_chat.py` `_build_chat_response` and the response models' serializers, per release.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sglang_standin import reasoning
from sglang_standin.errors import CONVERSION, VALIDATION, BadRequest
from sglang_standin.generation import Completion, detokenize
from sglang_standin.steering import Steering, parse_steering

logger = logging.getLogger("sglang_standin")

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",  # steering (sglang_standin.steering); in the key, so steered answers differ
    "regex",
)
# pydantic's lax bool: what it accepts for a `bool` field besides true/false.
_TRUE = frozenset({1, "1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({0, "0", "off", "f", "false", "n", "no"})
_PROMPT_CACHE_SIZE = 512


@dataclass
class ChatRequest:
    """Hold the fields of one chat completion request the stand-in acts on."""

    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    model: str = "default"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: Any = None
    separate_reasoning: bool = True
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False
    return_spec_tokens_details: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    steering: Steering = field(default_factory=Steering)
    n: int = 1


def parse_chat(body: Any, version: str) -> ChatRequest:
    """Validate a chat completion body; raise BadRequest as SGLang would, in its order.

    Pydantic validation first, then `_validate_request` ("Messages cannot be empty."), then
    `_convert_to_internal_request`, which refuses token ids with streaming (v0.5.23); the
    stand-in's own refusals of what it does not model (streaming, n > 1) come last.
    """
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", VALIDATION)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("Field required: messages (a list)", VALIDATION)
    clean = [_message(i, msg) for i, msg in enumerate(messages)]
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise BadRequest("max_tokens: Input should be a valid integer", VALIDATION)
    if max_tokens is not None and max_tokens < 0:
        raise BadRequest("max_tokens: must be at least 0", VALIDATION)
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest("model: Input should be a valid string", VALIDATION)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs: Input should be a valid dictionary", VALIDATION)
    req = ChatRequest(
        messages=clean,
        max_tokens=max_tokens,
        model=model,
        template_kwargs=kwargs,
        tools=body.get("tools"),
        separate_reasoning=_bool(body, "separate_reasoning", True),
        skip_special_tokens=_bool(body, "skip_special_tokens", True),
        sampling={k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None},
    )
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadRequest("n: Input should be a valid integer of at least 1", VALIDATION)
    req.n = n
    stream = _bool(body, "stream", False)
    if version != "v0.5.6":
        req.return_token_ids = _bool(body, "return_token_ids", False)
        req.return_prompt_token_ids = _bool(body, "return_prompt_token_ids", False)
        # protocol.py ChatCompletionRequest.return_spec_tokens_details (0.5.6 not modelled).
        req.return_spec_tokens_details = _bool(body, "return_spec_tokens_details", False)
    if not clean:
        raise BadRequest("Messages cannot be empty.")
    if stream and req.return_prompt_token_ids:
        raise BadRequest(
            "return_prompt_token_ids is not supported with streaming. "
            "Please set stream=false when using return_prompt_token_ids=true.",
            CONVERSION,
        )
    if stream and req.return_token_ids:
        raise BadRequest(
            "return_token_ids is not supported with streaming on /v1/chat/completions. "
            "Please set stream=false when using return_token_ids=true.",
            CONVERSION,
        )
    if stream:
        raise BadRequest("the stand-in does not model streaming", VALIDATION)
    req.steering = parse_steering(body)
    return req


def _message(i: int, msg: Any) -> dict[str, Any]:
    if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
        raise BadRequest(f"messages[{i}]: invalid message or role", VALIDATION)
    content = msg.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadRequest(f"messages[{i}]: only text content parts are modelled", VALIDATION)
            parts.append(str(part.get("text", "")))
        content = " ".join(parts)
    elif content is not None and not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content: Input should be a valid string", VALIDATION)
    return {**msg, "content": content}


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    if key not in body:
        return default
    value = body[key]
    probe = value.lower() if isinstance(value, str) else value
    if value is True or (not isinstance(value, bool) and probe in _TRUE):
        return True
    if value is False or (not isinstance(value, bool) and probe in _FALSE):
        return False
    raise BadRequest(f"{key}: Input should be a valid boolean", VALIDATION)


class ChatTemplater:
    """Apply the chat template and tokenize, remembering recent prompts (a retry costs no
    tokenization). The template may come from a file, kept apart from the tokenizer object,
    which the caller may share with other servers."""

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self._cache: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()

    @classmethod
    def load(cls, tokenizer: Any, value: str | None) -> ChatTemplater:
        """Use `--chat-template`'s file if it names one, else the tokenizer's template."""
        if value and os.path.isfile(value):
            with open(value, encoding="utf-8") as fh:
                text = fh.read()
            logger.info("chat template loaded from %s", value)
            return cls(tokenizer, text)
        if value:
            logger.info("stand-in: named chat template %r is not modelled; using the "
                        "tokenizer's", value)
        return cls(tokenizer, None)

    @property
    def template_text(self) -> str:
        return self.chat_template or getattr(self.tokenizer, "chat_template", None) or ""

    def render(self, req: ChatRequest) -> tuple[str, list[int]]:
        """Return (templated prompt, its token ids); a template error is a 400."""
        key = json.dumps(
            [req.messages, req.tools, req.template_kwargs], sort_keys=True, default=str
        )
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        kwargs = dict(req.template_kwargs)
        if req.tools is not None:
            kwargs["tools"] = req.tools
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        try:
            prompt = self.tokenizer.apply_chat_template(
                req.messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # a template error is the caller's input problem
            raise BadRequest(f"chat template failed: {exc}") from exc
        # The ids apply_chat_template(tokenize=True) gives: encoded without added BOS/EOS.
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        self._cache[key] = (prompt, ids)
        if len(self._cache) > _PROMPT_CACHE_SIZE:
            self._cache.popitem(last=False)
        return prompt, ids


@dataclass
class ChatAnswer:
    """What the server worked out for one request, to be written as SGLang's JSON."""

    completion: Completion
    prompt_ids: list[int]
    content: str | None
    reasoning_content: str | None
    reasoning_tokens: int = 0
    cached_tokens: int | None = None  # None: --enable-cache-report is off
    spec_details: dict[str, Any] | None = None  # speculative.SpecSettings.details


def chat_body(version: str, req: ChatRequest, answers: list[ChatAnswer]) -> dict[str, Any]:
    """Return the ChatCompletionResponse JSON as each release serializes it.

    v0.5.23 `protocol.py`: `ChatMessage._serialize` drops a None `tool_calls`,
    `ChatCompletionResponseChoice._serialize` drops None `prompt_token_ids` /
    `response_token_ids` (so they appear only when asked for), `UsageInfo` has
    `completion_tokens_details`. `usage_processor.py`: with the cache report, v0.5.23 always
    gives `{"cached_tokens": K}`, v0.5.6 only when K > 0.
    """
    new = version != "v0.5.6"
    answer = answers[0]
    p = len(answer.prompt_ids)
    # n > 1: usage sums the choices' completion and reasoning tokens (serving_chat.py).
    n = sum(a.completion.completion_tokens for a in answers)
    reasoning_tokens = sum(a.reasoning_tokens for a in answers)
    details = None
    if answer.cached_tokens is not None and (new or answer.cached_tokens > 0):
        details = {"cached_tokens": answer.cached_tokens}
    usage: dict[str, Any] = {
        "prompt_tokens": p,
        "total_tokens": p + n,
        "completion_tokens": n,
        "prompt_tokens_details": details,
        "reasoning_tokens": reasoning_tokens,
    }
    if new:
        r = reasoning_tokens
        usage["completion_tokens_details"] = {"reasoning_tokens": r} if r else None
    body: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [_choice(version, req, i, a) for i, a in enumerate(answers)],
        "usage": usage,
        "metadata": {"weight_version": "default"},
    }
    # serving_chat.py _build_chat_response: a response-level sglext, the details of every
    # choice that has some (one object for n = 1, a list for n > 1), absent when none.
    spec = [a.spec_details for a in answers if a.spec_details is not None]
    if req.return_spec_tokens_details and spec:
        body["sglext"] = {"spec_tokens_details": spec if req.n > 1 else spec[0]}
    return body


def _choice(version: str, req: ChatRequest, index: int, answer: ChatAnswer) -> dict[str, Any]:
    c = answer.completion
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content,
        "reasoning_content": answer.reasoning_content,
    }
    if version == "v0.5.6":
        message["tool_calls"] = None
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": c.finish,
        "matched_stop": c.matched_stop,
    }
    if req.return_token_ids or req.return_prompt_token_ids:
        choice["prompt_token_ids"] = answer.prompt_ids
    if req.return_token_ids:
        choice["response_token_ids"] = c.ids
    return choice


def answer_for(
    version: str,
    parser: str | None,
    req: ChatRequest,
    completion: Completion,
    prompt_ids: list[int],
    tokenizer: Any,
    template_text: str,
    think_end_ids: list[int],
) -> ChatAnswer:
    """Detokenize per the request, then split reasoning as the release's parser does."""
    text = completion.text
    if not req.skip_special_tokens:
        text = detokenize(tokenizer, completion.ids, completion.matched_stop, False)
    content, reasoning_content = reasoning.message_fields(
        version, parser, text, req.separate_reasoning, req.template_kwargs, template_text
    )
    count = reasoning.reasoning_tokens(
        version, parser, req.template_kwargs, completion.ids, think_end_ids
    )
    return ChatAnswer(completion, prompt_ids, content, reasoning_content, count)
