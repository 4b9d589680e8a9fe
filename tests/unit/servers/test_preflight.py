"""Preflight against small aiohttp servers: results table, 4xx messages, connection errors."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web

from include.servers.first_requests import PreflightError, PreflightResult, format_table, preflight

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

    from include.servers.first_requests import tokenizer_render_problem
    from include.target_tokenizer import load_tokenizer
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


# --- whole conversations (turns: all): the first turn is what the run sends ------------------

RUN = {"context_length": 1000, "max_tokens": 200, "context_margin": 16,
       "min_completion_tokens": 64}


def words(n: int, word: str) -> str:
    return " ".join([word] * n)


def whole_conversation(cid: str, turns: int, ask: int = 100, answer: int = 300) -> dict:
    """A chat whose every turn fits in RUN's context but whose whole length does not."""
    messages = [{"role": "system", "content": "You are helpful."}]
    for _ in range(turns):
        messages += [{"role": "user", "content": words(ask, "ask")},
                     {"role": "assistant", "content": words(answer, "said")}]
    return {"id": cid, "source": "chat", "metadata": {}, "messages": messages, "turns": "all",
            "call_format": "tool_call"}


def count_words(batch: list[list[dict[str, str]]]) -> list[int]:
    return [sum(len(m["content"].split()) + 4 for m in messages) + 2 for messages in batch]


def test_a_whole_conversation_is_preflighted_with_its_first_turn_as_the_engine_budgets_it(
) -> None:
    from types import SimpleNamespace

    from include.conversations import chain
    from include.engine.conversing import Conversations
    from include.servers.first_requests import longest_prompt
    from include.sglang.length import BudgetRule

    settings = SimpleNamespace(**RUN)
    conversation = whole_conversation("chat:0", turns=4)
    single = {"id": "flat:0", "messages": [{"role": "user", "content": words(60, "q")}]}
    assert count_words([conversation["messages"]])[0] > settings.context_length
    prompt, messages, p_tokens, max_tokens = longest_prompt([single, conversation],
                                                            count_words, settings)
    assert prompt["id"] == "chat:0"
    assert [m["role"] for m in messages] == ["system", "user"]
    # The engine's own plan for the conversation's first turn: the same request, P, budget.
    engine = Conversations(lambda ms: count_words([list(ms)])[0])
    engine.states["chat:0"] = chain.start("chat:0", conversation["messages"])
    assert engine.plan("chat:0", BudgetRule.of(settings)) == (messages, p_tokens, max_tokens)


@pytest.mark.parametrize("answer", [300, 20], ids=["whole-longer-than-context", "whole-fits"])
def test_preflight_run_sends_a_conversations_first_turn_ending_on_a_user_turn(
    tmp_path: Any, answer: int
) -> None:
    from types import SimpleNamespace

    from include.servers.first_requests import preflight_run
    from include.target_tokenizer import count_prompt_tokens, load_tokenizer
    from sglang_standin.tokenizer import build_chat_tokenizer

    tokenizer = build_chat_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(str(tokenizer))
    received: list[dict[str, Any]] = []

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "qwen", "max_model_len": 1000}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        prompt = count_prompt_tokens(tok, [body["messages"]], True)[0]
        if prompt + body["max_tokens"] > 1000:  # SGLang 0.5.23's length check
            return web.json_response({"object": "error", "message": "too long",
                                      "type": "BadRequestError", "code": 400}, status=400)
        return web.json_response({"choices": [{"finish_reason": "stop",
                                               "message": {"content": "x"}}],
                                  "usage": {"prompt_tokens": prompt, "completion_tokens": 1}})

    async def run() -> str:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        settings = SimpleNamespace(
            **RUN, tokenizer_path=str(tokenizer), model_path="Qwen/Qwen3.6-27B",
            enable_thinking=True, temperature=0.6, top_p=0.95, top_k=20, model_name="qwen",
            api_key=None, request_timeout_s=30.0)
        prompts = [whole_conversation(f"chat:{i}", 3, ask=40 + i, answer=answer)
                   for i in range(3)]
        try:
            return await asyncio.to_thread(preflight_run, settings,
                                           [f"http://127.0.0.1:{port}"], prompts)
        finally:
            await runner.cleanup()

    log = asyncio.run(run())
    [body] = received
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == words(42, "ask")  # the longest first turn
    assert "chat:2 (a whole conversation's first turn)" in log
