"""The radix cache on the wire: --enable-cache-report, cheaper prefill, multi-turn reuse."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from sglang_standin.testing import ThreadServer, call, chat

ServerFactory = Callable[..., ThreadServer]
QUESTION = "Explain the river and the stone " * 12


def _ttft_sum(server: ThreadServer) -> float:
    text = call("GET", server.url + "/metrics").body.decode()
    match = re.search(r"^sglang:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


@pytest.mark.parametrize("version", ["v0.5.23", "v0.5.6"])
def test_same_prompt_twice_is_served_from_the_cache_and_prefills_faster(
    make_server: ServerFactory, version: str
) -> None:
    # Prefill dominates: 5 ms a prompt token, in real time (the scale is 1).
    server = make_server(
        enable_cache_report=True, enable_metrics=True, standin_version=version,
        standin_time_scale=1.0, standin_prefill_per_token_us=5000,
        standin_median_output_tokens=4, standin_output_sigma=0.01,
    )  # fmt: skip
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    first = chat(server, QUESTION, **kwargs).json()["usage"]
    ttft_first = _ttft_sum(server)
    second = chat(server, QUESTION, **kwargs).json()["usage"]
    ttft_second = _ttft_sum(server) - ttft_first
    p = first["prompt_tokens"]
    assert p > 100
    # usage_processor.py: v0.5.23 always reports K, v0.5.6 only when K > 0.
    cold = {"cached_tokens": 0} if version == "v0.5.23" else None
    assert first["prompt_tokens_details"] == cold
    # One prompt token is always computed (schedule_batch.py _compute_max_prefix_len).
    assert second["prompt_tokens_details"] == {"cached_tokens": p - 1}
    assert ttft_first > 0.8 * p * 0.005 and ttft_second < ttft_first / 4
    # /flush_cache empties the tree.
    assert call("POST", server.url + "/flush_cache").status == 200
    again = chat(server, QUESTION, **kwargs).json()["usage"]
    assert again["prompt_tokens_details"] == cold


def test_without_the_report_usage_says_nothing_but_generate_does(
    make_server: ServerFactory,
) -> None:
    server = make_server()
    for _ in range(2):
        usage = chat(server, QUESTION).json()["usage"]
        assert usage["prompt_tokens_details"] is None
    meta = [call("POST", server.url + "/generate", {"text": QUESTION}).json()["meta_info"]
            for _ in range(2)]  # fmt: skip
    assert meta[0]["cached_tokens"] == 0
    assert meta[1]["cached_tokens"] == meta[1]["prompt_tokens"] - 1
    off = make_server(enable_cache_report=True, disable_radix_cache=True)
    for _ in range(2):
        assert chat(off, QUESTION).json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_a_follow_up_turn_reuses_the_previous_prompt_and_answer(
    make_server: ServerFactory, tokenizer: Any, rate: float
) -> None:
    server = make_server(enable_cache_report=True, standin_noncanonical_rate=rate)
    turn = [{"role": "user", "content": "Why is the sky blue?"}]
    body = {"model": "m", "messages": turn, "separate_reasoning": False, "return_token_ids": True}
    first = call("POST", server.url + "/v1/chat/completions", body).json()
    p1, n1 = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    answer = first["choices"][0]["message"]["content"]
    # A tool result follows: the answer stays after the last user query, so the template
    # keeps its reasoning and the history renders as it was sampled.
    follow = [*turn, {"role": "assistant", "content": answer},
              {"role": "tool", "content": "sunset: 19:42"}]  # fmt: skip
    second = call("POST", server.url + "/v1/chat/completions", {**body, "messages": follow}).json()
    k = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt2 = second["choices"][0]["prompt_token_ids"]
    assert prompt2[:p1] == first["choices"][0]["prompt_token_ids"]
    assert k >= p1
    if rate == 0.0:
        # Cached: prompt + answer but its last token (<|im_end|>, whose KV never existed);
        # the template re-renders the answer to exactly the sampled ids.
        assert k == p1 + n1 - 1
    else:
        # A non-canonical sample re-tokenizes differently: the match ends at the first split.
        sampled = first["choices"][0]["response_token_ids"]
        assert k < p1 + n1 - 1
        assert prompt2[p1:k] == sampled[: k - p1] and prompt2[k] != sampled[k - p1]


def test_a_new_user_turn_drops_the_answers_reasoning_and_the_cache_ends_there(
    make_server: ServerFactory, tokenizer: Any
) -> None:
    # Qwen3's template (imitated by the stand-in's) drops the reasoning of turns before the
    # last user query: the history is not the sampled ids, and the cache match stops at the
    # first token of the dropped think block.
    server = make_server(enable_cache_report=True)
    turn = [{"role": "user", "content": "Why is the sky blue?"}]
    body = {"model": "m", "messages": turn, "separate_reasoning": False, "return_token_ids": True}
    first = call("POST", server.url + "/v1/chat/completions", body).json()
    answer = first["choices"][0]["message"]["content"]
    assert answer.startswith("<think>") and "</think>" in answer
    follow = [*turn, {"role": "assistant", "content": answer},
              {"role": "user", "content": "And at sunset?"}]  # fmt: skip
    second = call("POST", server.url + "/v1/chat/completions", {**body, "messages": follow}).json()
    p1 = first["usage"]["prompt_tokens"]
    prompt2 = second["choices"][0]["prompt_token_ids"]
    sampled = first["choices"][0]["response_token_ids"]
    common = next(i for i, (a, b) in enumerate(zip(prompt2[p1:], sampled, strict=False))
                  if a != b)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == p1 + common
    shown = tokenizer.decode(prompt2[p1:])
    assert "</think>" not in shown and answer.split("</think>")[-1].strip() in shown
