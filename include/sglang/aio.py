"""SGLang's endpoints over ``aiohttp``: one ``ClientSession`` passed in, nothing raised for I/O.

Each call returns an ``Answer`` (``include.sglang.contract``) with the server's status and
body, or how it failed before answering: a timeout, no connection (``refused`` when nothing
listens), or a broken one. Only this module of the package imports aiohttp.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from include.sglang.contract import (
    CHAT,
    HEALTH,
    METRICS,
    MODELS,
    SERVER_INFO,
    Answer,
    Failure,
    json_body,
)

_JSON_TYPE = {"Content-Type": "application/json"}


def _failed(exc: BaseException) -> Answer:
    if isinstance(exc, TimeoutError):
        return Answer(failure=Failure.TIMEOUT, error=exc)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Answer(failure=Failure.CONNECT, error=exc,
                      refused=isinstance(exc.os_error, ConnectionRefusedError))
    return Answer(failure=Failure.DISCONNECTED, error=exc)


async def get(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Answer:
    """GET ``url`` + ``path`` and read the whole body; ``timeout`` None: the session's."""
    # Without a timeout of its own the call keeps the session's (aiohttp reads None as none).
    extra = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
    try:
        async with session.get(url + path, headers=headers, **extra) as resp:
            return Answer(resp.status, await resp.read())
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return _failed(exc)


async def health(session: aiohttp.ClientSession, url: str, timeout: float) -> Answer:
    """GET ``/health`` (no API key needed); pass ``health_probe_timeout_s`` as ``timeout``."""
    return await get(session, url, HEALTH, timeout=timeout)


async def models(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Answer:
    """GET ``/v1/models``: parse it with ``contract.served_model``."""
    return await get(session, url, MODELS, headers=headers, timeout=timeout)


async def server_info(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Answer:
    """GET ``/server_info``: parse it with ``contract.server_version``."""
    return await get(session, url, SERVER_INFO, headers=headers, timeout=timeout)


async def metrics(session: aiohttp.ClientSession, url: str, timeout: float) -> Answer:
    """GET ``/metrics`` (Prometheus text; 404 unless started with ``--enable-metrics``)."""
    return await get(session, url, METRICS, timeout=timeout)


async def chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
) -> Answer:
    """POST one non-streaming ``/v1/chat/completions`` with JSON ``body``."""
    # Encoded here (msgspec) rather than by aiohttp (json.dumps): a tenth of the CPU.
    headers = {**headers, **_JSON_TYPE} if headers else _JSON_TYPE
    try:
        async with session.post(url + CHAT, data=json_body(body), headers=headers,
                                timeout=timeout) as resp:
            return Answer(resp.status, await resp.read())
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return _failed(exc)
