"""Preflight against small aiohttp servers: results table, 4xx messages, connection errors."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web

from include.servers.preflight import PreflightError, PreflightResult, format_table, preflight

LENGTH_ERROR = (
    "Requested token count exceeds the model's maximum context length of 8192 tokens. You "
    "requested a total of 8212 tokens: 20 tokens from the input messages and 8192 tokens for "
    "the completion. Please reduce the number of tokens in the input messages or the completion "
    "to fit within the limit."
)


def app(reject: bool, ids: str = "none") -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "qwen", "max_model_len": 8192}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if reject:
            return web.json_response(
                {"object": "error", "message": LENGTH_ERROR, "type": "BadRequestError",
                 "param": None, "code": 400}, status=400,
            )  # fmt: skip
        assert body["max_tokens"] == 64 and body["temperature"] == 0.6
        assert body["return_token_ids"] is True
        await asyncio.sleep(0.05)
        choice: dict[str, Any] = {"finish_reason": "length", "message": {"content": "x"}}
        if ids != "none":  # SGLang 0.5.23; "short": fewer ids than its usage counts
            choice["prompt_token_ids"] = list(range(20))
            choice["response_token_ids"] = list(range(64 if ids == "exact" else 63))
        return web.json_response(
            {"choices": [choice], "usage": {"prompt_tokens": 20, "completion_tokens": 64}}
        )

    a = web.Application()
    a.router.add_get("/v1/models", models)
    a.router.add_post("/v1/chat/completions", chat)
    return a


async def run_with_servers(
    rejects: list[bool], ids: list[str] | None = None, **kwargs: Any
) -> list[PreflightResult]:
    runners, urls = [], []
    for i, reject in enumerate(rejects):
        runner = web.AppRunner(app(reject, (ids or [])[i] if ids else "none"))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    try:
        return await preflight(
            urls + kwargs.pop("extra_urls", []),
            [{"role": "user", "content": "hi"}],
            64,
            {"temperature": 0.6},
            "qwen",
            **kwargs,
        )
    finally:
        for runner in runners:
            await runner.cleanup()


def test_results_and_table() -> None:
    results = asyncio.run(run_with_servers([False, False]))
    assert all(r.ok and r.context_length == 8192 and r.completion_tokens == 64 for r in results)
    assert all(r.tokens_per_s and r.tokens_per_s > 0 for r in results)
    table = format_table(results).splitlines()
    assert table[0].split()[:3] == ["server", "model", "context"]
    assert len(table) == 3 and "ok (length)" in table[1]


def test_a_4xx_raises_with_the_servers_own_message() -> None:
    with pytest.raises(PreflightError) as err:
        asyncio.run(run_with_servers([False, True]))
    assert LENGTH_ERROR in str(err.value)
    assert "check `max_tokens`" in str(err.value)
    assert [r.ok for r in err.value.results] == [True, False]


def test_a_dead_server_is_reported_by_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(PreflightError, match=f"- {dead}: /v1/models: ClientConnectorError"):
        asyncio.run(run_with_servers([False], extra_urls=[dead], timeout=5))


def test_each_server_is_asked_whether_it_returns_its_token_ids() -> None:
    results = asyncio.run(run_with_servers([False, False], ids=["exact", "none"]))
    assert [r.token_ids for r in results] == [True, False] and all(r.ok for r in results)
    table = format_table(results).splitlines()
    assert "token ids" in table[0] and "yes" in table[1] and "no (text)" in table[2]


def test_token_ids_that_disagree_with_the_servers_usage_fail_preflight() -> None:
    with pytest.raises(PreflightError, match="63 sampled token ids, but its usage counts"):
        asyncio.run(run_with_servers([False], ids=["short"]))


def test_a_worker_tokenizer_that_renders_otherwise_than_the_servers_fails_preflight(
    tmp_path: Any,
) -> None:
    from types import SimpleNamespace

    from include.servers.preflight import tokenizer_render_problem
    from include.tokenization import load_tokenizer
    from sglang_standin.tokenizer import build_chat_tokenizer

    tok = load_tokenizer(str(build_chat_tokenizer(tmp_path / "tok")))
    messages = [{"role": "user", "content": "What is two plus two?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    settings = SimpleNamespace(tokenizer_path="/data/tok", model_path="Qwen/Qwen3.6-27B")
    same = PreflightResult("http://a", True, prompt_tokens=len(ids), prompt_token_ids=list(ids))
    assert tokenizer_render_problem(settings, tok, messages, True, [same]) == ""
    other = PreflightResult("http://b", True, prompt_tokens=len(ids) + 1,
                            prompt_token_ids=[*ids[:3], 7, *ids[3:]])
    problem = tokenizer_render_problem(settings, tok, messages, True, [same, other])
    assert "'/data/tok'" in problem and "http://b" in problem and "first difference at id 3" \
        in problem
    counted = PreflightResult("http://c", True, prompt_tokens=len(ids) + 2)
    assert "counts" in tokenizer_render_problem(settings, tok, messages, True, [counted])
    assert "prompt_token_ids" not in same.to_dict()
