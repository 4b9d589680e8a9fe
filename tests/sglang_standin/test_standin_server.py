"""Contract tests of the stand-in's HTTP endpoints (servers run in a thread of this process)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sglang_standin.testing import ThreadServer, call, chat

ServerFactory = Callable[..., ThreadServer]

LONG = "word " * 60


def _prompt_tokens(tokenizer: Any, content: str, **kwargs: Any) -> int:
    msgs = [{"role": "user", "content": content}]
    enc = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, **kwargs)
    return len(enc["input_ids"])


def test_warm_up_gates_health_but_not_model_listing(make_server: ServerFactory) -> None:
    server = make_server(wait=False, standin_warmup_seconds=0.6, context_length=4096)
    for path in ("/health", "/health_generate"):
        early = call("GET", server.url + path)
        assert early.status == 503 and early.body == b""
    models = call("GET", server.url + "/v1/models")
    assert models.status == 200
    card = models.json()["data"][0]
    assert models.json()["object"] == "list"
    assert card == {
        "id": server.config.model_path,
        "object": "model",
        "created": card["created"],
        "owned_by": "sglang",
        "root": server.config.model_path,
        "parent": None,
        "max_model_len": 4096,
    }
    assert call("GET", server.url + "/get_server_info").json()["status"] == "Starting"
    server.wait_ready()
    assert call("GET", server.url + "/get_server_info").json()["status"] == "Up"


def test_health_takes_a_second_when_up_and_503_at_once_otherwise(
    make_server: ServerFactory,
) -> None:
    # http_server.py health_generate: 503 while starting, else sleep(1) before the first look.
    server = make_server(wait=False, standin_warmup_seconds=3, standin_time_scale=0.001)
    start = time.monotonic()
    assert call("GET", server.url + "/health").status == 503
    assert time.monotonic() - start < 0.5
    up = make_server(standin_time_scale=0.001)  # fixed 1 s, not scaled by the time scale
    for path in ("/health", "/health_generate"):
        start = time.monotonic()
        ready = call("GET", up.url + path)
        assert ready.status == 200 and ready.body == b""
        assert 1.0 <= time.monotonic() - start < 3.0
    start = time.monotonic()
    assert chat(up).status == 200 and call("GET", up.url + "/v1/models").status == 200
    assert time.monotonic() - start < 1.0  # nothing else waits
    hung = make_server(standin_hang_after_requests=0)
    with pytest.raises(TimeoutError):
        chat(hung, timeout=0.3)
    start = time.monotonic()
    assert call("GET", hung.url + "/health").status == 503
    assert time.monotonic() - start < 0.5


def test_server_info_model_info_and_default_context_length(make_server: ServerFactory) -> None:
    server = make_server(served_model_name="drafter-target", max_running_requests=8)
    older = make_server(standin_version="v0.5.6")
    assert call("GET", older.url + "/server_info").json()["version"] == "0.5.6"
    for path in ("/get_server_info", "/server_info"):
        info = call("GET", server.url + path).json()
        assert info["context_length"] is None  # not given on the command line
        assert info["served_model_name"] == "drafter-target"
        assert info["status"] == "Up" and info["version"] == "0.5.23"
        assert info["standin_version"] == "v0.5.23" and info["standin_length_check"] == "v0.5.23"
        assert info["max_total_num_tokens"] == 262144
        assert info["max_req_input_len"] == 32768 - 6
        assert set(info["internal_states"][0]) >= {"last_gen_throughput"}
        assert info["standin_ceiling_gen_throughput"] == pytest.approx(
            8 / ((0.020 + 0.0004 * 8) * 0.01)
        )
    models = call("GET", server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "drafter-target"
    assert models["data"][0]["max_model_len"] == 32768  # --standin-default-context-length
    model_info = call("GET", server.url + "/get_model_info").json()
    assert model_info["model_path"] == server.config.model_path
    assert model_info["is_generation"] is True and model_info["weight_version"] == "default"
    assert "context_length" not in model_info


def test_context_length_falls_back_to_model_config(
    tmp_path: Any, make_server: ServerFactory
) -> None:
    from sglang_standin.cli import parse_args

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 12345}))
    assert parse_args(["--model-path", str(tmp_path)]).resolve_context_length() == 12345
    assert (
        parse_args(
            ["--model-path", str(tmp_path), "--context-length", "99"]
        ).resolve_context_length()
        == 99
    )


@pytest.mark.parametrize("version", ["v0.5.23", "v0.5.6"])
def test_chat_completion_shape_usage_and_determinism(
    make_server: ServerFactory, tokenizer: Any, version: str
) -> None:
    server = make_server(standin_version=version)
    reply = chat(server, "Tell me a story", chat_template_kwargs={"enable_thinking": False})
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
    body = reply.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["object"] == "chat.completion" and body["model"] == "whatever"
    assert body["metadata"] == {"weight_version": "default"}
    (choice,) = body["choices"]
    # v0.5.23 protocol.py serializers drop a None tool_calls and absent token ids.
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    msg = choice["message"]
    keys = ["role", "content", "reasoning_content"]
    assert list(msg) == (keys if version == "v0.5.23" else [*keys, "tool_calls"])
    assert msg["role"] == "assistant" and msg.get("tool_calls") is None
    assert msg["reasoning_content"] is None
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    usage = body["usage"]
    p = _prompt_tokens(tokenizer, "Tell me a story", enable_thinking=False)
    n = len(tokenizer.encode(msg["content"], add_special_tokens=False)) + 1  # + the EOS
    expected: dict[str, Any] = {
        "prompt_tokens": p,
        "total_tokens": p + n,
        "completion_tokens": n,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    if version == "v0.5.23":
        expected["completion_tokens_details"] = None
    assert usage == expected and list(usage) == list(expected)
    again = chat(server, "Tell me a story", chat_template_kwargs={"enable_thinking": False})
    assert again.json()["choices"] == body["choices"] and again.json()["id"] != body["id"]
    assert chat(server, "Tell me another").json()["choices"] != body["choices"]


def test_max_tokens_cap_gives_finish_reason_length(make_server: ServerFactory) -> None:
    server = make_server(standin_median_output_tokens=400)
    body = chat(
        server, "Go on", max_tokens=7, chat_template_kwargs={"enable_thinking": False}
    ).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["matched_stop"] is None
    assert body["usage"]["completion_tokens"] == 7


@pytest.mark.parametrize("version", ["v0.5.23", "v0.5.6"])
def test_reasoning_split_and_cut_before_think_end(make_server: ServerFactory, version: str) -> None:
    server = make_server(
        reasoning_parser="qwen3", standin_version=version, standin_median_output_tokens=200
    )
    # v0.5.6 forces the parser only for an explicit enable_thinking (serving_chat.py); the
    # text opens with <think> either way, so the split is the same.
    full = chat(server, "Why?").json()["choices"][0]
    msg = full["message"]
    assert full["finish_reason"] == "stop"
    raw = chat(server, "Why?", separate_reasoning=False).json()["choices"][0]["message"]
    assert raw["reasoning_content"] is None and raw["content"].startswith("<think>\n")
    thought, answer = raw["content"].removeprefix("<think>").split("</think>", 1)
    if version == "v0.5.23":  # parser/reasoning_parser.py: a raw split, nothing stripped
        assert (msg["reasoning_content"], msg["content"]) == (thought, answer)
        assert thought.startswith("\n") and answer.startswith("\n\n")
    else:  # v0.5.6: tags removed and both ends stripped, the answer stripped again
        assert (msg["reasoning_content"], msg["content"]) == (thought.lstrip(), answer.strip())
    cut = chat(server, "Why?", max_tokens=5).json()["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["reasoning_content"]
    assert cut["message"]["content"] == (None if version == "v0.5.6" else "")
    off = chat(server, "Why?", chat_template_kwargs={"enable_thinking": False}).json()
    assert off["choices"][0]["message"]["reasoning_content"] is None
    assert off["choices"][0]["message"]["content"]


@pytest.mark.parametrize("mode", ["v0.5.23", "v0.5.6"])
def test_three_length_errors_exact_texts(
    make_server: ServerFactory, tokenizer: Any, mode: str
) -> None:
    c = 120
    server = make_server(context_length=c, standin_length_check=mode)
    p = _prompt_tokens(tokenizer, LONG)
    assert 60 < p < c - 6

    def error(content: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        reply = chat(server, content, **extra)
        return reply.status, reply.json()

    def envelope(message: str) -> dict[str, Any]:
        return {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }

    long_p = _prompt_tokens(tokenizer, LONG * 2)
    assert long_p >= c
    assert error(LONG * 2) == (
        400,
        envelope(
            f"The input ({long_p} tokens) is longer than the model's context length ({c} tokens)."
        ),
    )

    m = c - p + 1
    assert error(LONG, max_tokens=m) == (
        400,
        envelope(
            f"Requested token count exceeds the model's maximum context length of {c} tokens. "
            f"You requested a total of {p + m} tokens: {p} tokens from the input messages and "
            f"{m} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        ),
    )
    status, body = error(LONG, max_tokens=c - p)  # P + M == C: only v0.5.6 rejects it
    if mode == "v0.5.6":
        assert status == 400 and body["message"].startswith("Requested token count exceeds")
    else:
        assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    assert error(LONG, max_tokens=c - p - 1)[0] == 200

    # A prompt in [C-6, C-1] without max_tokens hits the scheduler's input check.
    near = LONG
    while _prompt_tokens(tokenizer, near) < c - 6:
        near += " word"
    near_p = _prompt_tokens(tokenizer, near)
    assert c - 6 <= near_p <= c - 1
    assert error(near) == (
        400,
        envelope(
            f"Input length ({near_p} tokens) exceeds the maximum allowed length ({c - 6} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        ),
    )

    gen = call(
        "POST",
        server.url + "/generate",
        {"text": "x " * 200, "sampling_params": {"max_new_tokens": 4}},
    )
    assert gen.status == 400 and list(gen.json()) == ["error"]
    assert gen.json()["error"]["message"].startswith("The input (")


def test_no_max_tokens_stops_at_context_minus_two_minus_p(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    c = 100
    server = make_server(context_length=c, standin_median_output_tokens=5000)
    body = chat(server, "hi", chat_template_kwargs={"enable_thinking": False}).json()
    p = _prompt_tokens(tokenizer, "hi", enable_thinking=False)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == c - 2 - p


def test_generate_native_shape_and_default_max_new_tokens(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    server = make_server(standin_median_output_tokens=3000, standin_output_sigma=0.1)
    body = call("POST", server.url + "/generate", {"text": "Once upon a time"}).json()
    assert list(body) == ["text", "output_ids", "meta_info"]
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 128}
    assert meta["completion_tokens"] == 128 == len(body["output_ids"])
    assert meta["prompt_tokens"] == len(
        tokenizer.encode("Once upon a time", add_special_tokens=False)
    )
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] >= 0
    assert tokenizer.decode(body["output_ids"]) == body["text"]
    short = make_server(standin_median_output_tokens=10, standin_output_sigma=0.1)
    done = call(
        "POST", short.url + "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 500}}
    ).json()
    assert done["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }


def test_body_validation_errors_are_400(make_server: ServerFactory) -> None:
    server = make_server()
    url = server.url + "/v1/chat/completions"
    for reply in (
        call("POST", url, raw=b"{not json"),
        call("POST", url, {"model": "m"}),
        call("POST", url, {"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}),
        call("POST", url, {"messages": [{"role": "wizard", "content": "x"}]}),
        call("POST", server.url + "/generate", {"sampling_params": {}}),
    ):
        assert reply.status == 400
        body = reply.json()
        assert body["object"] == "error" and body["code"] == 400 and body["param"] is None
        assert body["type"] == "Bad Request" and body["message"]


def test_api_key_guards_everything_but_health_and_metrics(make_server: ServerFactory) -> None:
    server = make_server(api_key="sekret", enable_metrics=True)
    good = {"Authorization": "Bearer sekret"}
    for path in ("/v1/models", "/get_server_info", "/get_model_info", "/flush_cache"):
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            denied = call("GET", server.url + path, headers=headers)
            assert denied.status == 401 and denied.body == b'{"error":"Unauthorized"}', path
        assert call("GET", server.url + path, headers=good).status == 200, path
    assert chat(server).status == 401
    assert chat(server, headers=good).status == 200
    assert call("GET", server.url + "/info").status == 401  # even unknown paths
    for path in ("/health", "/health_generate", "/metrics"):
        assert call("GET", server.url + path).status == 200, path
    info = call("GET", server.url + "/get_server_info", headers=good).json()
    assert "sekret" not in json.dumps(info)


@pytest.mark.parametrize("version", ["v0.5.23", "v0.5.6"])
def test_metrics_text_and_labels(make_server: ServerFactory, version: str) -> None:
    plain = make_server()
    assert call("GET", plain.url + "/metrics").status == 404
    server = make_server(enable_metrics=True, served_model_name='m"1', standin_version=version)
    for _ in range(3):
        assert chat(server).status == 200
    reply = call("GET", server.url + "/metrics")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
    text = reply.body.decode()
    # Scheduler gauges: metrics_collector.py (v0.5.23) / scheduler_metrics_mixin.py (v0.5.6);
    # tokenizer-manager counters and histograms: model_name (+ engine_type since v0.5.23).
    name = 'model_name="m\\"1"'
    if version == "v0.5.23":
        sched = f'{name},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        label = f'{name},engine_type="unified"'
    else:
        sched = f'{name},engine_type="unified",tp_rank="0",pp_rank="0"'
        label = name
    values = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    assert values[f"sglang:num_running_reqs{{{sched}}}"] == 0
    assert values[f"sglang:num_queue_reqs{{{sched}}}"] == 0
    assert values[f"sglang:token_usage{{{sched}}}"] == 0
    assert f"sglang:gen_throughput{{{sched}}}" in values
    assert values[f"sglang:num_requests_total{{{label}}}"] == 3
    assert values[f"sglang:prompt_tokens_total{{{label}}}"] > 0
    assert values[f"sglang:generation_tokens_total{{{label}}}"] >= 3
    # The same prompt thrice: the radix cache serves all but one token the second and third time.
    p = values[f"sglang:prompt_tokens_total{{{label}}}"] / 3
    assert values[f"sglang:cached_tokens_total{{{label}}}"] == 2 * (p - 1)
    for hist in ("sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"):
        assert f"# TYPE {hist} histogram" in text
        assert values[f"{hist}_count{{{label}}}"] == 3
        assert values[f'{hist}_bucket{{{label},le="+Inf"}}'] == 3


def _slow_server(make_server: ServerFactory, **flags: Any) -> ThreadServer:
    # ~1000 tokens at ~20 ms a step: a request stays in flight for seconds.
    slow = {
        "standin_time_scale": 1.0,
        "standin_median_output_tokens": 1000,
        "standin_output_sigma": 0.01,
    }
    return make_server(**{**slow, **flags})


def test_queue_full_is_503_and_flush_cache_refuses_while_busy(
    make_server: ServerFactory,
) -> None:
    server = _slow_server(make_server, max_running_requests=1, max_queued_requests=1)
    assert call("GET", server.url + "/flush_cache").status == 200
    assert call("POST", server.url + "/flush_cache").body.startswith(b"Cache flushed.\n")
    assert server.server is not None
    sched = server.server.scheduler.sched
    pool = ThreadPoolExecutor(2)
    try:
        running = []
        # One at a time: a request not yet admitted still counts against the queue cap.
        for i, state in enumerate([(1, 0), (1, 1)]):
            running.append(pool.submit(chat, server, f"q{i}", timeout=1.5))
            deadline = time.monotonic() + 5
            while (len(sched.running), len(sched.waiting)) != state:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        full = chat(server, "one too many")
        assert full.status == 503
        assert full.body == (
            b'{"object":"error","message":"The request queue is full.",'
            b'"type":"503","param":null,"code":503}'
        )
        assert call("GET", server.url + "/flush_cache").status == 400
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    for fut in running:
        with pytest.raises(TimeoutError):
            fut.result()  # the client gave up; the server aborts the request
    deadline = time.monotonic() + 5
    while not sched.idle:
        assert time.monotonic() < deadline, "disconnected requests were not aborted"
        time.sleep(0.02)


def test_injected_500_hang_and_drop(make_server: ServerFactory) -> None:
    errors = make_server(standin_error_rate=1.0)
    reply = chat(errors)
    assert reply.status == 500 and reply.json()["type"] == "InternalServerError"
    assert reply.json()["code"] == 500

    hangs = make_server(standin_hang_rate=1.0)
    with pytest.raises(TimeoutError):
        chat(hangs, timeout=0.5)
    assert call("GET", hangs.url + "/health").status == 200

    drops = make_server(standin_drop_rate=1.0)
    with pytest.raises((ConnectionError, OSError)) as info:
        chat(drops)
    assert not isinstance(info.value, TimeoutError)

    after = make_server(standin_hang_after_requests=1)
    assert chat(after).status == 200
    with pytest.raises(TimeoutError):
        chat(after, timeout=0.5)
    assert call("GET", after.url + "/health").status == 503


def test_throughput_rises_with_concurrency_on_the_wire(make_server: ServerFactory) -> None:
    """Count tokens per modelled step-time via the server's own counters, not wall clock."""
    server = make_server(
        standin_time_scale=0.05, standin_median_output_tokens=60, standin_output_sigma=0.01
    )
    assert server.server is not None
    sched = server.server.scheduler.sched

    def run(in_flight: int) -> float:
        tokens0, clock0 = sched.generated_tokens_total, sched.clock
        with ThreadPoolExecutor(in_flight) as pool:
            list(
                pool.map(
                    lambda i: chat(
                        server, f"c{in_flight}-{i}", chat_template_kwargs={"enable_thinking": False}
                    ),
                    range(in_flight * 2),
                )
            )
        return (sched.generated_tokens_total - tokens0) / (sched.clock - clock0)

    low, high = run(2), run(32)
    assert high >= 3 * low


def test_idle_keep_alive_connection_is_closed_after_about_5_s(make_server: ServerFactory) -> None:
    server = make_server()
    port = server.config.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert sock.recv(4096) == b""  # the server closed the idle connection
        waited = time.monotonic() - start
    assert 3.5 < waited < 8.0


def test_concurrent_requests_are_not_serialised(make_server: ServerFactory) -> None:
    server = _slow_server(make_server, standin_time_scale=0.02)
    results: list[int] = []

    def one(i: int) -> None:
        results.append(chat(server, f"r{i}").status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8
    # One request takes ~1000 steps * 0.4 ms; eight batched take far less than eight times that.
    assert time.monotonic() - start < 8 * 1000 * 0.0204 * 0.02 * 0.8


def test_zero_latency_bypasses_the_performance_model(make_server: ServerFactory) -> None:
    server = _slow_server(make_server, standin_zero_latency=True, enable_metrics=True)
    assert server.server is not None
    for i in range(3):
        body = chat(server, f"z{i}", timeout=5).json()
        assert body["usage"]["completion_tokens"] > 900  # ~20 s each if it were modelled
    sched = server.server.scheduler.sched
    assert sched.clock == 0.0 and sched.generated_tokens_total == 0
    assert server.server.metrics.num_requests_total == 3


def test_chat_template_file_and_tokenizer_path(
    make_server: ServerFactory, tmp_path: Any, tokenizer_dir: Any, tokenizer: Any
) -> None:
    text = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}ASSISTANT:"
    template = tmp_path / "plain.jinja"
    template.write_text(text)
    server = make_server(chat_template=str(template), tokenizer_path=str(tokenizer_dir))
    body = chat(server, "hello").json()
    msgs = [{"role": "user", "content": "hello"}]
    enc = tokenizer.apply_chat_template(
        msgs, chat_template=text, tokenize=True, add_generation_prompt=True
    )
    assert body["usage"]["prompt_tokens"] == len(enc["input_ids"])
    assert len(enc["input_ids"]) != _prompt_tokens(tokenizer, "hello")  # the file was used
    # No generation prompt of the thinking template: the model does not think.
    assert not body["choices"][0]["message"]["content"].startswith("<think>")
    # The shared tokenizer object keeps its own template.
    assert "<|im_start|>" in tokenizer.chat_template
