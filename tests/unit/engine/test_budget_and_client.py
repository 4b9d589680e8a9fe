"""Token budgets, SGLang's length errors, request bodies, metrics and the window controller."""

from __future__ import annotations

import pytest

from include.engine.client import (
    ChatRequest,
    ChatResult,
    ErrorKind,
    _parse_completion,
    build_body,
)
from include.engine.window import next_window, parse_metrics
from include.sglang.length import BudgetRule, prompt_tokens_from_length_error

# The three texts, verbatim from SGLang (shared/docs/sglang-contract.md).
TOO_LONG = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
TOTAL = (
    "Requested token count exceeds the model's maximum context length of 8192 tokens. You "
    "requested a total of 8692 tokens: 500 tokens from the input messages and 8192 tokens for "
    "the completion. Please reduce the number of tokens in the input messages or the "
    "completion to fit within the limit."
)
NEAR = ("Input length (8190 tokens) exceeds the maximum allowed length (8186 tokens). Use a "
        "shorter input or enable --allow-auto-truncate.")


def test_the_real_runs_8192_cap_on_an_8192_context_never_asks_for_too_much() -> None:
    for prompt_tokens in (1, 500, 4000, 7900):
        b = BudgetRule(8192, cap=8192, margin=16, min_completion=256).budget(prompt_tokens)
        assert b.skip_reason is None
        assert prompt_tokens + b.max_tokens < 8192  # v0.5.6 rejects P + M >= C
        assert b.max_tokens == min(8192, 8192 - prompt_tokens - 16)


def test_cap_applies_when_there_is_room() -> None:
    assert BudgetRule(32768, cap=8192, margin=16, min_completion=256).budget(100).max_tokens == 8192


def test_prompt_leaving_too_little_room_is_skipped_with_the_numbers() -> None:
    b = BudgetRule(8192, cap=8192, margin=16, min_completion=256).budget(8000)
    assert b.skip_reason == "prompt_too_long"
    assert "8000 tokens" in b.detail and "176" in b.detail and "256" in b.detail


@pytest.mark.parametrize(("message", "p"), [(TOO_LONG, 9000), (TOTAL, 500), (NEAR, 8190)])
def test_prompt_tokens_are_read_from_each_length_error(message: str, p: int) -> None:
    assert prompt_tokens_from_length_error(message) == p


def test_other_messages_are_not_length_errors() -> None:
    assert prompt_tokens_from_length_error("Unauthorized") is None


def test_body_carries_budget_sampling_and_thinking_switch() -> None:
    req = ChatRequest("a", [{"role": "user", "content": "hi"}], 77,
                      {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "enable_thinking": False},
                      "m")
    body = build_body(req)
    assert body["max_tokens"] == 77 and body["model"] == "m" and body["top_k"] == 20
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    req2 = ChatRequest("a", [], 5, {"temperature": 0, "top_p": 1, "top_k": -1}, "m")
    assert "top_k" not in build_body(req2) and "chat_template_kwargs" not in build_body(req2)


def test_body_asks_for_the_sampled_ids_and_the_undivided_text() -> None:
    body = build_body(ChatRequest("a", [], 5, {}, "m"))
    # SGLang 0.5.23 protocol.py: return_token_ids adds prompt_token_ids + response_token_ids;
    # separate_reasoning off keeps <think>...</think> inline; special tokens kept.
    assert body["return_token_ids"] is True and body["stream"] is False
    assert body["separate_reasoning"] is False and body["skip_special_tokens"] is False


def _answer(choice: dict, usage: dict | None = None) -> bytes:
    import json

    return json.dumps({"model": "m", "choices": [choice],
                       "usage": usage or {"prompt_tokens": 2, "completion_tokens": 3}}).encode()


def test_an_answer_keeps_the_servers_ids_and_raw_text() -> None:
    result = ChatResult()
    _parse_completion(result, _answer({
        "message": {"content": "<think>\nR\n</think>\n\nC", "reasoning_content": None},
        "finish_reason": "stop", "matched_stop": 9,
        "prompt_token_ids": [1, 2], "response_token_ids": [5, 6, 9]}))
    assert result.ok and result.text == "<think>\nR\n</think>\n\nC"
    assert (result.prompt_token_ids, result.response_token_ids) == ([1, 2], [5, 6, 9])
    assert result.matched_stop == 9
    older = ChatResult()  # SGLang 0.5.6 ignores return_token_ids: text only
    _parse_completion(older, _answer({"message": {"content": "C"}, "finish_reason": "stop"}))
    assert older.ok and older.response_token_ids is None and older.text == "C"


def test_an_answer_split_by_the_server_or_with_bad_ids_is_refused() -> None:
    split = ChatResult()
    _parse_completion(split, _answer({"message": {"content": "\n\nC", "reasoning_content": "R"},
                                      "finish_reason": "stop"}))
    assert not split.ok and split.error_kind == ErrorKind.BAD_RESPONSE and "split" in split.error
    bad = ChatResult()
    _parse_completion(bad, _answer({"message": {"content": "C"}, "finish_reason": "stop",
                                    "response_token_ids": ["5"]}))
    assert not bad.ok and bad.error_kind == ErrorKind.BAD_RESPONSE


@pytest.mark.parametrize("choice", [
    {"message": {"content": "C"}, "response_token_ids": [5, True]},  # JSON true: not an id
    {"message": {"content": "C"}, "prompt_token_ids": [1, 2.0]},
    {"message": None},  # json.loads + .get() raised AttributeError here: the engine crashed
    {"finish_reason": "stop"},
])
def test_a_malformed_answer_is_a_bad_response_naming_the_field(choice: dict) -> None:
    result = ChatResult()
    _parse_completion(result, _answer(choice))
    assert not result.ok and result.error_kind == ErrorKind.BAD_RESPONSE
    assert "$.choices[0]" in result.error  # where in the answer it went wrong


def test_an_answer_without_choices_or_not_json_is_a_bad_response() -> None:
    for body in (b'{"choices": []}', b"<html>502</html>", b'{"model": "m"}'):
        result = ChatResult()
        _parse_completion(result, body)
        assert not result.ok and result.error_kind == ErrorKind.BAD_RESPONSE
        assert repr(body[:5])[2:-1] in result.error


def test_metrics_text_is_parsed_and_labels_summed() -> None:
    text = (
        "# HELP sglang:num_queue_reqs q\n# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="m"} 3.0\n'
        'sglang:num_running_reqs{model_name="m"} 64\n'
        'sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 5\n'
    )
    m = parse_metrics(text)
    assert m["sglang:num_queue_reqs"] == 3.0 and m["sglang:num_running_reqs"] == 64.0


def test_window_grows_while_the_queue_is_empty_and_the_window_is_used() -> None:
    assert next_window(32, 32, queue=0, running=32, low=8, high=512) == 48
    assert next_window(32, 32, queue=1, running=32, low=8, high=512) == 40
    # not using its window: no reason to grow
    assert next_window(32, 10, queue=0, running=10, low=8, high=512) == 32


def test_window_shrinks_when_the_queue_piles_up_and_respects_bounds() -> None:
    assert next_window(200, 200, queue=100, running=64, low=8, high=512) < 200
    assert next_window(10, 10, queue=500, running=64, low=8, high=512) == 8
    assert next_window(510, 510, queue=0, running=64, low=8, high=512) == 512


def test_window_converges_to_a_short_non_empty_queue_on_a_model_server() -> None:
    # A server runs at most 64 requests; the rest of what the client sends waits in its queue.
    window = 8
    for _ in range(60):
        running = min(window, 64)
        queue = max(0, window - 64)
        window = next_window(window, window, queue, running, low=8, high=512)
    assert 64 <= window <= 64 + 3 * 4 + 16


def test_clients_sharing_a_server_converge_without_starving_it() -> None:
    # Three shards in flight share one server that runs at most 64 requests at once.
    windows = [32, 32, 32]
    history = []
    for _ in range(40):
        total = sum(windows)
        running, queue = min(total, 64), max(0, total - 64)
        windows = [next_window(w, w, queue, running, low=8, high=512) for w in windows]
        history.append(sum(windows))
    assert all(total >= 64 for total in history[5:]), history  # the batch stays full
    assert history[-1] <= 64 + 3 * 12, history  # and the queue stays short


def test_a_shard_outcome_repr_leaves_the_records_out() -> None:
    # asyncio.run (3.11) reprs the run's result as it ends: a repr of every record, text and
    # token ids was ~6% of a shard's client CPU.
    from include.engine.outcome import ShardOutcome

    records = {f"p{i}": {"id": f"p{i}", "text": "x" * 1000} for i in range(100)}
    outcome = ShardOutcome("shard-00001", 100, 0, records, {"completed": 100}, 0, 1.0, 0, [])
    assert "xxxx" not in repr(outcome) and len(repr(outcome)) < 500
    assert outcome.records is records
