"""What an SGLang server answers, as plain data: endpoints, the health floor, answer parses.

Facts from SGLang 0.5.23 (``python/sglang/srt/entrypoints/http_server.py``,
``entrypoints/openai/protocol.py``); see ``shared/docs/sglang-contract.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from include.outcomes import ErrorKind

HEALTH = "/health"
MODELS = "/v1/models"
SERVER_INFO = "/server_info"
METRICS = "/metrics"
CHAT = "/v1/chat/completions"

#: The least time a healthy SGLang server takes to answer ``/health``: its handler
#: (``health_generate``) submits a one-token generation, then sleeps 1 s before it first looks
#: whether the scheduler answered. A probe that gives up sooner sees every healthy server down.
HEALTH_ANSWER_MIN_S = 1.0
#: The shortest timeout any ``/health`` probe may use: the 1 s sleep, plus a loaded host's
#: scheduling and the round trip, with room to spare.
HEALTH_PROBE_TIMEOUT_FLOOR_S = 5.0

class Failure(StrEnum):
    """How a call failed before any HTTP answer (``Answer.failure``).

    The same words as ``include.outcomes.ErrorKind``'s three, so a failure reads one way in
    the journal, the logs and the monitor.
    """

    #: No answer within the timeout.
    TIMEOUT = ErrorKind.TIMEOUT.value
    #: No connection could be made (refused, unreachable, name not resolved).
    CONNECT = ErrorKind.CONNECT.value
    #: The connection broke (closed mid-answer, reset, a body cut short) or another error.
    DISCONNECTED = ErrorKind.DISCONNECTED.value


def health_probe_timeout_s(wanted: float = 0.0) -> float:
    """Return the timeout of one ``/health`` probe: ``wanted``, never below the floor."""
    return max(HEALTH_PROBE_TIMEOUT_FLOOR_S, float(wanted))


def bearer(api_key: str | None) -> dict[str, str]:
    """Return the headers carrying the servers' API key ({} without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Answer:
    """One HTTP call's outcome: the server's status and body, or how it failed before one.

    ``failure`` is ``""`` when the server answered (any status), else ``TIMEOUT``,
    ``CONNECT`` or ``DISCONNECTED``; ``error`` is the exception itself, so each caller words
    its message as it always has (its type name, its ``os_error``).
    """

    status: int | None = None
    body: bytes = b""
    failure: str = ""
    error: BaseException | None = None
    #: For ``CONNECT``: whether the host actively refused (nothing listens on the port).
    refused: bool = False

    @property
    def answered(self) -> bool:
        """Return whether an HTTP answer came back (whatever its status)."""
        return not self.failure

    def text(self) -> str:
        """Return the body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """Return the body parsed as JSON; raise ValueError when it is not JSON."""
        return json.loads(self.body)


class ChatMessage(msgspec.Struct):
    """The ``message`` of a chat completion's choice (its other fields are not read)."""

    content: Any = None
    reasoning_content: Any = None


class ChatChoice(msgspec.Struct):
    """One choice of a chat completion (SGLang 0.5.23 ``ChatCompletionResponseChoice``)."""

    message: ChatMessage
    finish_reason: Any = None
    matched_stop: Any = None
    #: With ``return_token_ids`` (0.5.23): exactly integers, checked as the body is read (a
    #: JSON ``true`` or ``2.0`` is refused), so they go to the journal with no second pass.
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None


class ChatCompletion(msgspec.Struct):
    """A ``/v1/chat/completions`` answer, as much of it as this project reads."""

    choices: list[ChatChoice]
    usage: dict[str, Any] | None = None
    model: Any = None
    metadata: Any = None


# Reads straight into the structs above, skipping the fields nobody reads: the answer's
# token ids are most of its bytes, and json.loads plus a Python check of every id was the
# client's largest cost per request after aiohttp itself (bench_client_overhead).
_CHAT_COMPLETION = msgspec.json.Decoder(ChatCompletion)
_JSON = msgspec.json.Encoder()


def chat_completion(body: bytes) -> ChatCompletion:
    """Parse a 200 answer of ``/v1/chat/completions``; raise ValueError when it is not one
    (not JSON, or a field of the wrong type, e.g. token ids that are not all integers)."""
    return _CHAT_COMPLETION.decode(body)


def json_body(body: Any) -> bytes:
    """Return a request body as JSON bytes (UTF-8, no ASCII escapes)."""
    return _JSON.encode(body)


def served_models(models_json: Any) -> list[dict[str, Any]]:
    """Return the model entries of a ``/v1/models`` answer ([] when it has none or is malformed)."""
    if not isinstance(models_json, dict) or not isinstance(models_json.get("data"), list):
        return []
    return [m for m in models_json["data"] if isinstance(m, dict)]


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``: the served name and its effective context length."""

    id: str | None
    max_model_len: int | None


def served_model(models_json: Any, name: str | None = None) -> ServedModel:
    """Return the entry named ``name`` (else the first) of a ``/v1/models`` answer.

    ``max_model_len`` is the only place SGLang shows its effective context length. Raise
    LookupError when the answer lists no model.
    """
    models = served_models(models_json)
    if not models:
        raise LookupError(f"/v1/models lists no model (answer: {str(models_json)[:200]!r})")
    match = next((m for m in models if name is not None and m.get("id") == name), models[0])
    length = match.get("max_model_len")
    return ServedModel(match.get("id"), length if isinstance(length, int) else None)


def server_version(info: Any) -> str | None:
    """Return SGLang's version from a ``/server_info`` answer (None when it does not say)."""
    version = info.get("version") if isinstance(info, dict) else None
    return str(version) if version is not None else None


def unauthorized_cause(sglang_conn_id: str | None = None) -> str:
    """Return why a server answers 401, naming the connection holding the run's API key."""
    conn = (f"Airflow connection {sglang_conn_id!r} (REGEN_SGLANG_CONN_ID)" if sglang_conn_id
            else "the Airflow connection named by REGEN_SGLANG_CONN_ID")
    return (f"it was started with another API key than the password of {conn}; set that "
            "password to the servers' key, or relaunch the servers with it")
