"""Send one real chat completion to every server before a run spends hours on them.

``preflight(...)`` asks each server its context length (``/v1/models``) and sends one
``/v1/chat/completions`` with the run's sampling settings (``preflight_run``: the longest
request the run will send first, a whole conversation's first turn; ``longest_prompt``
says why not a later one); any failure raises
``PreflightError`` listing every failing server, and a 4xx carries the server's own message
(e.g. SGLang's "Requested token count exceeds the model's maximum context length ...").
It also finds out, once per server, whether the server returns the token ids it sampled
(SGLang >= 0.5.23 with ``return_token_ids``): rows from a server that does are its ids
exactly; a server that does not (older releases ignore the field) is named in the log, and
its rows are tokenized from the raw generated text. ``format_table`` renders the per-server
results for the task log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from include.engine.client import ChatRequest, send_chat
from include.sglang import aio
from include.sglang.contract import bearer, served_model, server_version

log = logging.getLogger(__name__)


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
    #: Whether the answer carried the server's prompt and sampled token ids.
    token_ids: bool | None = None
    #: SGLang's version as ``/server_info`` reports it (None when it does not say).
    version: str | None = None
    error: str = ""
    #: The server's prompt ids (compared with the worker's render; not in ``to_dict``).
    prompt_token_ids: list[int] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        data = asdict(self)
        data.pop("prompt_token_ids")
        return data


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    request: ChatRequest,
    headers: dict[str, str],
) -> PreflightResult:
    base = url.rstrip("/")
    result = PreflightResult(url=base, ok=False)
    answer = await aio.models(session, base, headers)
    try:
        if not answer.answered:
            raise answer.error or ConnectionError(answer.failure)
        if answer.status == 200:
            served = served_model(answer.json(), request.model)
            result.model, result.context_length = served.id, served.max_model_len
    except LookupError:
        pass  # no model listed: the chat request below says what is wrong
    except (TimeoutError, OSError, aiohttp.ClientError, ValueError) as exc:
        result.error = f"/v1/models: {type(exc).__name__}: {exc}"
        return result
    result.version = await _version(session, base, headers)
    # The same request code the engine uses, so preflight exercises the real path.
    answer = await send_chat(session, base, request, headers)
    result.status = answer.status
    result.latency_s = answer.latency_s
    if not answer.ok:
        status = f"HTTP {answer.status}: " if answer.status else ""
        result.error = f"{status}{answer.error}"
        return result
    result.prompt_tokens = answer.usage.get("prompt_tokens")
    result.completion_tokens = answer.usage.get("completion_tokens")
    result.finish_reason = answer.finish_reason
    if result.completion_tokens and result.latency_s:
        result.tokens_per_s = result.completion_tokens / result.latency_s
    result.token_ids = answer.response_token_ids is not None
    result.prompt_token_ids = answer.prompt_token_ids
    problem = token_id_problem(answer)
    if problem:
        result.error = problem
        return result
    result.ok = True
    return result


async def _version(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str]
) -> str | None:
    answer = await aio.server_info(session, base, headers)
    if answer.status != 200:
        return None  # informative only: the chat request decides
    try:
        return server_version(answer.json())
    except ValueError:
        return None


def tokenizer_render_problem(settings: Any, tok: Any, messages: list[dict[str, Any]],
                             thinking: bool, results: list[PreflightResult]) -> str:
    """Return how the worker's tokenizer renders the prompt otherwise than the servers ('' if
    it does not): token budgets, the text path and every tokenization check use it.

    Compared with each server's own prompt ids where it returned them, else its count.
    """
    from include.target_tokenizer import render_prompts

    text = render_prompts(tok, [messages], thinking)[0]
    ours = list(tok(text, add_special_tokens=False)["input_ids"])
    which = (f"tokenizer_path {settings.tokenizer_path!r}" if settings.tokenizer_path
             else f"the model path's tokenizer {settings.model_path!r}")
    for r in results:
        theirs = r.prompt_token_ids
        if theirs is not None and theirs != ours:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                      min(len(ours), len(theirs)))
            return (f"{which} renders the preflight prompt to {len(ours)} token ids, server "
                    f"{r.url} to {len(theirs)} (first difference at id {at}): this worker's "
                    "tokenizer or chat template is not the servers'. Point tokenizer_path at "
                    "the target model's own tokenizer (or leave it empty to use model_path).")
        if theirs is None and r.prompt_tokens is not None and r.prompt_tokens != len(ours):
            return (f"{which} counts {len(ours)} prompt tokens for the preflight prompt, server "
                    f"{r.url} {r.prompt_tokens}: this worker's tokenizer or chat template is not "
                    "the servers'. Point tokenizer_path at the target model's own tokenizer.")
    return ""


def token_id_problem(answer: Any) -> str:
    """Return why a server's token ids cannot be trusted ('' when they can, or are absent).

    The ids must be as many as the server's own usage counts: prompt ids ==
    ``usage.prompt_tokens``, sampled ids == ``usage.completion_tokens``.
    """
    prompt_ids, sampled = answer.prompt_token_ids, answer.response_token_ids
    if sampled is None and prompt_ids is None:
        return ""
    if sampled is None or prompt_ids is None:
        return ("returned only some of the token ids asked for (prompt_token_ids and "
                "response_token_ids)")
    usage = answer.usage
    if len(prompt_ids) != usage.get("prompt_tokens") or len(sampled) != usage.get(
        "completion_tokens"
    ):
        return (f"returned {len(prompt_ids)} prompt and {len(sampled)} sampled token ids, "
                f"but its usage counts {usage.get('prompt_tokens')} and "
                f"{usage.get('completion_tokens')}")
    return ""


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

    ``sampling`` holds the run's sampling settings (``temperature``, ``top_p``, ``top_k``,
    ``enable_thinking``), sent exactly as the engine sends them. ``timeout`` bounds each
    server's two requests. Raise PreflightError when any server fails; a 4xx message is the
    server's own text, so a length rejection reads as SGLang wrote it.
    """
    request = ChatRequest("preflight", messages, max_tokens, sampling, model)
    headers = bearer(api_key)
    connector = aiohttp.TCPConnector(limit=max(1, len(urls)))
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:
        results = list(await asyncio.gather(*(_one(session, u, request, headers) for u in urls)))
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
    header = ("server", "model", "context", "latency s", "prompt", "completion", "tok/s",
              "version", "token ids", "status")
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
                r.version or "-",
                {True: "yes", False: "no (text)", None: "-"}[r.token_ids],
                f"ok ({r.finish_reason})" if r.ok else (r.error[:60] or "failed"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


def longest_prompt(
    prompts: list[dict[str, Any]], count_tokens: Any, settings: Any, candidates: int = 32
) -> tuple[dict[str, Any], list[dict[str, Any]], int, int]:
    """Return the prompt whose first request has the most tokens and still gets a budget,
    that request, its P and its budget.

    The first request is what the engine sends first (``conversing.first_request``): a
    prompt's messages, or a whole conversation's first turn. Every later turn holds the
    target's own answers, unknown before the run, and is budgeted from the server's count
    and ended ``context_exhausted`` before it is sent; the whole dataset conversation, its
    assistant turns included, is never sent at all. The budget is the engine's for that
    request. Only the ``candidates`` longest by characters are tokenized. Raise ValueError
    when no prompt fits at all (every one would be skipped as too long).
    """
    from include.engine.conversing import first_request
    from include.sglang.length import BudgetRule

    requests = [(p, first_request(p)) for p in prompts]
    requests.sort(key=lambda pr: -sum(len(m["content"]) for m in pr[1]))
    pool = requests[:candidates]
    counts = count_tokens([messages for _, messages in pool])
    ranked = sorted(zip(counts, range(len(pool)), strict=True), reverse=True)
    for p_tokens, i in ranked:
        budget = BudgetRule.of(settings).budget(p_tokens)
        if not budget.skip_reason:
            return pool[i][0], pool[i][1], p_tokens, budget.max_tokens
    raise ValueError(
        f"none of the {len(pool)} longest prompts fits: each leaves less than "
        f"min_completion_tokens ({settings.min_completion_tokens}) under context_length "
        f"({settings.context_length}); raise context_length or lower max_prompt_length"
    )


def preflight_run(settings: Any, urls: list[str], prompts: list[dict[str, Any]]) -> str:
    """Preflight every server with the run's longest first request; return the table for the
    log.

    The request goes out with its real token budget and the run's sampling settings. Raise
    PreflightError on any failure.
    """
    from include.engine.conversing import is_conversation
    from include.target_tokenizer import count_prompt_tokens, load_tokenizer

    tok = load_tokenizer(settings.tokenizer_path or settings.model_path)
    prompt, messages, p_tokens, max_tokens = longest_prompt(
        prompts, lambda convs: count_prompt_tokens(tok, convs, settings.enable_thinking), settings
    )
    sampling = {"temperature": settings.temperature, "top_p": settings.top_p,
                "top_k": settings.top_k, "enable_thinking": settings.enable_thinking}
    results = asyncio.run(preflight(urls, messages, max_tokens, sampling,
                                    settings.model_name, settings.api_key,
                                    timeout=settings.request_timeout_s))
    render_problem = tokenizer_render_problem(
        settings, tok, messages, settings.enable_thinking, results)
    if render_problem:
        raise PreflightError(render_problem + "\n" + format_table(results), results)
    text_only = [r.url for r in results if not r.token_ids]
    note = ""
    if text_only:
        note = (f"\nno token ids from {', '.join(text_only)} (SGLang before 0.5.23 ignores "
                "return_token_ids): their rows are tokenized from the raw generated text, "
                "and each tokenized manifest counts them (token_source)")
        log.warning("%s", note.strip())
    turn = " (a whole conversation's first turn)" if is_conversation(prompt) else ""
    return (f"preflight prompt {prompt['id']}{turn}: {p_tokens} prompt tokens, max_tokens "
            f"{max_tokens}\n" + format_table(results) + note)
