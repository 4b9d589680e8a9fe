"""Send one real chat completion to every server before a run spends hours on them.

``preflight(...)`` asks each server its context length (``/v1/models``) and sends one
``/v1/chat/completions`` with the run's sampling settings; any failure raises
``PreflightError`` listing every failing server, and a 4xx carries the server's own message
(e.g. SGLang's "Requested token count exceeds the model's maximum context length ...").
``format_table`` renders the per-server results for the task log.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp


class PreflightError(RuntimeError):
    """A server failed its preflight request; the message lists each server and its error."""

    def __init__(self, message: str, results: list[PreflightResult]) -> None:
        super().__init__(message)
        self.results = results


@dataclass
class PreflightResult:
    """Hold one server's preflight answer: model, context length, latency and speed."""

    url: str
    ok: bool
    model: str | None = None
    context_length: int | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_per_s: float | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return asdict(self)


def _error_message(body: Any, text: str) -> str:
    """Return the message of an SGLang error body (flat on /v1, nested elsewhere) or the text."""
    if isinstance(body, dict):
        if isinstance(body.get("message"), str):
            return body["message"]
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
    return text.strip()[:500]


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
) -> PreflightResult:
    base = url.rstrip("/")
    result = PreflightResult(url=base, ok=False)
    try:
        async with session.get(base + "/v1/models", headers=headers) as resp:
            if resp.status == 200:
                models = await resp.json(content_type=None)
                data = models.get("data") or [{}]
                match = next((m for m in data if m.get("id") == payload["model"]), data[0])
                result.model = match.get("id")
                result.context_length = match.get("max_model_len")
        started = time.perf_counter()
        async with session.post(
            base + "/v1/chat/completions", json=payload, headers=headers
        ) as resp:
            text = await resp.text()
            result.latency_s = time.perf_counter() - started
            result.status = resp.status
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {_error_message(body, text)}"
                return result
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    usage = (body or {}).get("usage") or {}
    choices = (body or {}).get("choices") or [{}]
    result.prompt_tokens = usage.get("prompt_tokens")
    result.completion_tokens = usage.get("completion_tokens")
    result.finish_reason = choices[0].get("finish_reason")
    if result.completion_tokens and result.latency_s:
        result.tokens_per_s = result.completion_tokens / result.latency_s
    result.ok = True
    return result


async def preflight(
    urls: list[str],
    messages: list[dict[str, Any]],
    max_tokens: int,
    sampling: dict[str, Any],
    model: str,
    api_key: str | None = None,
    timeout: float = 600.0,
) -> list[PreflightResult]:
    """Send one chat completion to every server at once; return one result per URL, in order.

    ``sampling`` holds extra request fields (``temperature``, ``top_p``, ``top_k``,
    ``chat_template_kwargs``...). ``timeout`` bounds each server's two requests. Raise
    PreflightError when any server fails; a 4xx message is the server's own text, so a
    length rejection reads as SGLang wrote it.
    """
    payload = {**sampling, "model": model, "messages": messages, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=max(1, len(urls)))
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:
        results = list(await asyncio.gather(*(_one(session, u, payload, headers) for u in urls)))
    failed = [r for r in results if not r.ok]
    if failed:
        client_errors = any(r.status is not None and 400 <= r.status < 500 for r in failed)
        hint = (
            "; a 4xx means the request itself is wrong for the server: check `max_tokens`, "
            "`context_length` and the sampling settings"
            if client_errors
            else ""
        )
        raise PreflightError(
            f"preflight failed on {len(failed)} of {len(results)} servers{hint}:\n"
            + "\n".join(f"- {r.url}: {r.error}" for r in failed)
            + "\n"
            + format_table(results),
            results,
        )
    return results


def format_table(results: list[PreflightResult]) -> str:
    """Render results as a fixed-width table, one row per server, for the task log."""
    header = ("server", "model", "context", "latency s", "prompt", "completion", "tok/s", "status")
    rows = [header]
    for r in results:
        rows.append(
            (
                r.url,
                r.model or "-",
                str(r.context_length or "-"),
                f"{r.latency_s:.2f}" if r.latency_s is not None else "-",
                str(r.prompt_tokens if r.prompt_tokens is not None else "-"),
                str(r.completion_tokens if r.completion_tokens is not None else "-"),
                f"{r.tokens_per_s:.1f}" if r.tokens_per_s is not None else "-",
                f"ok ({r.finish_reason})" if r.ok else (r.error[:60] or "failed"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )
