"""SGLang's error texts and envelopes, copied byte for byte (see the contract page)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

QUEUE_FULL_TEXT = "The request queue is full."
#: `type` of a body that fails pydantic validation (http_server.py validation_exception_handler).
VALIDATION = "Bad Request"
#: `type` of a ValueError raised while the request is converted (serving_base.handle_request).
CONVERSION = "BadRequest"
#: `type` of errors from serving_chat / the tokenizer manager (create_error_response default).
BAD_REQUEST = "BadRequestError"


class BadRequest(Exception):
    """A request the real server rejects with 400; `err_type` is the envelope's `type`."""

    def __init__(self, message: str, err_type: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.err_type = err_type


async def read_json(request: web.Request) -> Any:
    """Return the request's JSON body; malformed JSON is a validation 400."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"JSON decode error: {exc}", VALIDATION) from exc


def json_response(data: Any, status: int = 200) -> web.Response:
    """Return compact JSON like FastAPI's ORJSONResponse (no spaces, UTF-8 kept raw)."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return web.Response(body=body.encode(), status=status, content_type="application/json")


def flat_error(message: str, err_type: str, code: int) -> web.Response:
    """Return SGLang's flat /v1 error envelope (its ErrorResponse, not OpenAI's nested one)."""
    return json_response(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": code},
        status=code,
    )


def length_error(
    prompt_tokens: int,
    max_new_tokens: int | None,
    context_length: int,
    max_req_input_len: int,
    mode: str,
) -> str | None:
    """Return SGLang's 400 message for a prompt/max_tokens that does not fit, else None.

    Order as in SGLang: the tokenizer manager's two checks (`tokenizer_manager.py`
    `_validate_one_request`), then the scheduler's input check (`managers/utils.py`
    `validate_input_length`). `mode` "v0.5.23" rejects P + M > C, "v0.5.6" P + M >= C.
    """
    p, c = prompt_tokens, context_length
    if p >= c:
        return f"The input ({p} tokens) is longer than the model's context length ({c} tokens)."
    if max_new_tokens is not None:
        total = p + max_new_tokens
        if total > c or (mode == "v0.5.6" and total == c):
            return (
                f"Requested token count exceeds the model's maximum context length of {c} tokens."
                f" You requested a total of {total} tokens: {p} tokens from the input messages"
                f" and {max_new_tokens} tokens for the completion. Please reduce the number of"
                " tokens in the input messages or the completion to fit within the limit."
            )
    if p >= max_req_input_len:
        return (
            f"Input length ({p} tokens) exceeds the maximum allowed length "
            f"({max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
        )
    return None


def lora_error(model: str, served_name: str) -> str | None:
    """Return the 400 for a request `model` naming a LoRA adapter (`NAME:adapter`), else None.

    `serving_base.py` `_parse_model_parameter` reads the part after the colon as an adapter;
    without `--enable-lora` (not modelled) the request fails (v0.5.23 `tokenizer_manager.py`
    `_validate_and_resolve_lora`, v0.5.6 `serving_base.py` `_validate_lora_enabled`).
    """
    if ":" not in model or model == served_name:
        return None
    if model.startswith(f"{served_name}:"):
        adapter = model[len(served_name) + 1 :].strip()
    else:
        adapter = model.split(":", 1)[1].strip()
    if not adapter:
        return None
    return (
        f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. "
        "Please launch the server with --enable-lora flag and preload adapters "
        "using --lora-paths or /load_lora_adapter endpoint."
    )


def served_name_error(name: str) -> str | None:
    """Return SGLang's start-up assertion text for a served model name holding ':'.

    v0.5.23 `arg_groups/validation_hook.py` `check_server_args` (v0.5.6 `server_args.py`
    `check_server_args`, same text): the colon is kept for `model:adapter`.
    """
    if ":" not in name:
        return None
    return (
        "served_model_name cannot contain a colon (':') character. "
        "The colon is reserved for the 'model:adapter' syntax used in LoRA adapter "
        f"specification. Invalid value: '{name}'"
    )
