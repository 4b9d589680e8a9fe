"""Whole conversations tokenized: each turn checked as sent, one row where prefix-stable.

The turns come from a real stand-in server (its ids, its template), driven by the chain of
``include.conversations``, as the engine drives it.
"""

from __future__ import annotations

import json
from itertools import compress
from pathlib import Path
from typing import Any

import pytest

from include.conversations import chain
from include.conversations.records import conversation_record
from include.tokenization import TokenizeOptions, tokenize_completions
from sglang_standin.testing import ThreadServer, call

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
SYSTEM = f"You may call functions. <tools> {json.dumps(TOOLS)} </tools>"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
TOOL_CHAIN = [  # the original: a call, its result, an answer
    {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Rain in Oslo?"},
    {"role": "assistant", "content": CALL}, {"role": "tool", "content": '{"rain": true}'},
    {"role": "assistant", "content": "Yes, take an umbrella."},
]
CHAT = [  # two user turns
    {"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "x"},
    {"role": "user", "content": "And at sunset?"}, {"role": "assistant", "content": "y"},
]


@pytest.fixture
def server(hf_tokenizer: Any, chat_tokenizer_dir: Path) -> Any:
    s = ThreadServer.start(hf_tokenizer, chat_tokenizer_dir, True, standin_warmup_seconds=0.05,
                           standin_time_scale=0.01, standin_median_output_tokens=40,
                           standin_tool_call_rate=1.0)
    yield s
    s.close()


def regenerate(server: Any, cid: str, messages: list[dict], thinking: bool = True) -> dict:
    state = chain.start(cid, messages)
    while not state.finished:
        request = chain.next_request(state)
        body = {"model": "m", "messages": request, "separate_reasoning": False,
                "return_token_ids": True, "skip_special_tokens": False, "max_tokens": 400,
                "chat_template_kwargs": {"enable_thinking": thinking}}
        choice = call("POST", server.url + "/v1/chat/completions", body).json()
        usage = choice["usage"]
        c = choice["choices"][0]
        state = chain.after_turn(state, chain.TurnResult(
            c["message"]["content"], c["finish_reason"], c.get("matched_stop"),
            c.get("prompt_token_ids"), c.get("response_token_ids"), usage, server.url))
    record = conversation_record(state, {"id": cid, "source": "s"}, model="m",
                                 sampling={"enable_thinking": thinking})
    return {**record, "messages": messages}


def test_a_tool_chain_is_prefix_stable_and_becomes_one_exact_row(server: Any,
                                                                 hf_tokenizer: Any) -> None:
    record = regenerate(server, "c1", TOOL_CHAIN)
    assert record["end"]["reason"] == "completed" and len(record["turn_results"]) == 2
    result = tokenize_completions(hf_tokenizer, [record])
    assert [s.id for s in result.samples] == ["c1"], result.quarantined
    row = result.samples[0]
    turns = record["turn_results"]
    assert row.input_ids == turns[1]["prompt_token_ids"] + turns[1]["response_token_ids"]
    # The loss covers exactly what the target sampled, both turns, and nothing else.
    trained = turns[0]["response_token_ids"] + turns[1]["response_token_ids"]
    assert list(compress(row.input_ids, row.loss_mask)) == trained
    assert sum(row.loss_mask) == len(trained)
    conv = result.manifest()["conversations"]
    assert conv["whole_rows"] == 1 and conv["turn_rows"] == 0 and conv["turns"] == 2
    assert conv["by_source"] == {"s": {"whole_rows": 1, "turn_rows": 0}}
    assert result.manifest()["counts"]["input"] == 1


def test_a_chat_with_thinking_is_not_prefix_stable_and_keeps_one_row_per_turn(
    server: Any, hf_tokenizer: Any
) -> None:
    record = regenerate(server, "c2", CHAT)
    assert len(record["turn_results"]) == 2
    result = tokenize_completions(hf_tokenizer, [record])
    assert [s.id for s in result.samples] == ["c2#turn-0", "c2#turn-1"], result.quarantined
    for sample, turn in zip(result.samples, record["turn_results"], strict=True):
        assert sample.input_ids == turn["prompt_token_ids"] + turn["response_token_ids"]
        assert list(compress(sample.input_ids, sample.loss_mask)) == turn["response_token_ids"]
    conv = result.manifest()["conversations"]
    assert conv["kept_apart"] == {"not_prefix_stable": 1} and conv["turn_rows"] == 2
    assert "turn 1" in conv["example_difference"]
    assert conv["by_source"] == {"s": {"whole_rows": 0, "turn_rows": 2}}
    # Turn 1's conversation holds the target's own first answer (generated in this run), not
    # the dataset's "x"; the dataset's user turns are marked as the dataset's.
    second_turn = result.samples[1].conversation
    assert [(m["role"], m["generated"]) for m in second_turn] == [
        ("user", False), ("assistant", True), ("user", False), ("assistant", True)]
    assert second_turn[1]["content"] == record["turn_results"][0]["text"] != "x"
    assert result.manifest()["text_path"]["dataset_turns"] == 0
    # The second turn's prompt shows the first answer without its reasoning, as sent.
    second = hf_tokenizer.decode(record["turn_results"][1]["prompt_token_ids"])
    assert second.count("<think>") == 0


def test_a_turn_the_server_did_not_sample_as_recorded_is_quarantined(server: Any,
                                                                     hf_tokenizer: Any) -> None:
    record = regenerate(server, "c3", TOOL_CHAIN)
    record["turn_results"][0]["response_token_ids"][1] += 1  # not what the server sampled
    result = tokenize_completions(hf_tokenizer, [record])
    assert {q["id"]: q["reason"] for q in result.quarantined} == {"c3#turn-0": "decode_mismatch"}
    # The other turn is still an exact row of its own; no whole row from a failed turn.
    assert [s.id for s in result.samples] == ["c3#turn-1"]
    assert result.manifest()["conversations"]["kept_apart"] == {"a_turn_kept_out": 1}


def test_include_reasoning_off_keeps_turns_apart(server: Any, hf_tokenizer: Any) -> None:
    record = regenerate(server, "c4", TOOL_CHAIN)
    result = tokenize_completions(hf_tokenizer, [record],
                                  TokenizeOptions(include_reasoning=False))
    assert [s.id for s in result.samples] == ["c4#turn-0", "c4#turn-1"]
    assert result.manifest()["conversations"]["kept_apart"] == {"include_reasoning_off": 1}
