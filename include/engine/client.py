"""One request to an SGLang server's OpenAI-compatible chat endpoint, and its result.

Shaped like vLLM's benchmark request functions: a request dataclass in, a result dataclass out,
one shared ``aiohttp.ClientSession`` passed in; the HTTP call itself is
``include.sglang.aio.chat``. Every failure is recorded in the result with
its HTTP status, the server's message and whether a retry can succeed; nothing is raised.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from include.outcomes import RETRYABLE, ErrorKind
from include.sglang import aio, contract
from include.sglang.length import prompt_tokens_from_length_error


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to send: the prompt, its token budget and the sampling settings."""

    prompt_id: str
    messages: list[dict[str, str]]
    max_tokens: int
    sampling: dict[str, Any]
    model: str


@dataclass
class ChatResult:
    """What one attempt produced; ``ok`` is False with ``error_kind`` set on any failure."""

    ok: bool = False
    server: str = ""
    status: int | None = None
    error_kind: str | None = None
    error: str = ""
    #: The generated text exactly as the server decoded it (``separate_reasoning`` off, so
    #: thinking stays inline; special tokens kept; the matched stop token trimmed).
    text: str | None = None
    #: The server's own token ids (SGLang >= 0.5.23 with ``return_token_ids``), else None:
    #: the prompt as the server tokenized it, and the sampled ids through the stop token.
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    #: The weights that answered, as SGLang >= 0.5.23 says in ``metadata.weight_version``
    #: (``/update_weight_version`` changes it on a live server), else None.
    weight_version: str | None = None
    latency_s: float = 0.0

    @property
    def retryable(self) -> bool:
        """Return whether another attempt (maybe on another server) can succeed."""
        return self.error_kind in RETRYABLE


def build_body(request: ChatRequest) -> dict[str, Any]:
    """Return the JSON body SGLang's ``/v1/chat/completions`` takes for ``request``."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "stream": False,
        # The drafter trains on what the target sampled: ask for the ids themselves (releases
        # before 0.5.23 ignore the field, and the answer then carries text only), and for the
        # text undivided, since how a reasoning parser splits it differs between releases.
        "return_token_ids": True,
        "separate_reasoning": False,
        "skip_special_tokens": False,
    }
    for name in ("temperature", "top_p"):
        if name in sampling:
            body[name] = sampling[name]
    if sampling.get("top_k", -1) != -1:
        body["top_k"] = sampling["top_k"]
    if "enable_thinking" in sampling:
        body["chat_template_kwargs"] = {"enable_thinking": sampling["enable_thinking"]}
    return body


def _error_message(text: str) -> str:
    # SGLang's /v1 errors are flat ({"object":"error","message":...}); OpenAI's are nested.
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:2000]
    if isinstance(data, dict):
        if isinstance(data.get("message"), str):
            return data["message"]
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    return text.strip()[:2000]


def new_session(connections: int, request_timeout_s: float, connect_timeout_s: float
                ) -> aiohttp.ClientSession:
    """Return the one session a shard run sends through (made inside its running loop):
    ``connections`` at most, every request bounded by the two timeouts."""
    connector = aiohttp.TCPConnector(
        limit=connections,
        limit_per_host=0,
        # SGLang closes idle keep-alive connections after ~5 s; drop ours first so a
        # request is rarely written onto a connection the server is closing.
        keepalive_timeout=4.0,
    )
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def send_chat(
    session: aiohttp.ClientSession,
    server: str,
    request: ChatRequest,
    headers: dict[str, str] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
) -> ChatResult:
    """Send one chat completion to ``server`` and return its result; never raises for I/O."""
    result = ChatResult(server=server)
    start = time.perf_counter()
    answer = await aio.chat(session, server, build_body(request), headers, timeout)
    if answer.answered:
        result.status = answer.status
        if answer.status == 200:
            _parse_completion(result, answer.body)
        else:
            _classify_error(result, answer.status, answer.text())
    elif answer.failure == contract.Failure.TIMEOUT:
        result.error_kind, result.error = ErrorKind.TIMEOUT, "request timed out"
    elif answer.failure == contract.Failure.CONNECT:
        os_error = getattr(answer.error, "os_error", answer.error)
        result.error_kind, result.error = ErrorKind.CONNECT, f"cannot connect: {os_error}"
    else:  # closed mid-answer, reset on a pooled connection, a body cut short
        exc = answer.error
        result.error_kind, result.error = ErrorKind.DISCONNECTED, f"{type(exc).__name__}: {exc}"
    result.latency_s = time.perf_counter() - start
    return result


def _parse_completion(result: ChatResult, body: bytes) -> None:
    try:
        data = contract.chat_completion(body)
        choice = data.choices[0]
    except (ValueError, IndexError) as exc:  # msgspec's errors are ValueErrors
        result.error_kind = ErrorKind.BAD_RESPONSE
        result.error = f"unexpected 200 body ({type(exc).__name__}: {exc}): {body[:300]!r}"
        return
    text, reasoning = choice.message.content, choice.message.reasoning_content
    result.finish_reason = choice.finish_reason
    result.matched_stop = choice.matched_stop
    result.usage = data.usage or {}
    result.model = data.model
    metadata = data.metadata
    if isinstance(metadata, dict) and metadata.get("weight_version") is not None:
        result.weight_version = str(metadata["weight_version"])
    result.prompt_token_ids = choice.prompt_token_ids
    result.response_token_ids = choice.response_token_ids
    if reasoning:
        # A server that split the text anyway (``separate_reasoning`` ignored): the parts
        # cannot be joined back exactly, whatever the release's whitespace rules.
        result.error_kind = ErrorKind.BAD_RESPONSE
        result.error = ("the server split the reasoning from the answer although "
                        "separate_reasoning was false; the exact text cannot be rebuilt")
        return
    result.text = text if isinstance(text, str) else ""
    if result.finish_reason == "abort":
        # SGLang aborts requests it drops (e.g. during shutdown); the answer is incomplete.
        result.error_kind, result.error = ErrorKind.HTTP_5XX, "server aborted the request"
        return
    result.ok = True


def _classify_error(result: ChatResult, status: int, text: str) -> None:
    message = _error_message(text)
    result.error = message
    if status == 401:
        result.error_kind = ErrorKind.UNAUTHORIZED
    elif status == 503 and "queue is full" in message:
        result.error_kind = ErrorKind.QUEUE_FULL
    elif status >= 500:
        result.error_kind = ErrorKind.HTTP_5XX
    elif status == 400 and prompt_tokens_from_length_error(message) is not None:
        result.error_kind = ErrorKind.LENGTH
    else:
        result.error_kind = ErrorKind.HTTP_4XX
