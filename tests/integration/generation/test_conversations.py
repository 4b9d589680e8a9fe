"""Whole conversations (``turns: all``) through the engine, against real stand-in servers.

Every turn is the server's own (its sampled log is the authority), tool results follow only
a matching call, turns stay on the server holding the history, and a resumed shard goes on
at each conversation's next turn without regenerating one.
"""

from __future__ import annotations

import json

import pytest

from include.durability.journal import FileJournal
from include.engine.dispatch import run_shard
from include.generation.shard import build_shard_output
from include.target_tokenizer import load_tokenizer
from include.tokenization import tokenize_completions
from sglang_standin.testing import read_sampled_log
from tests.integration.generation.helpers import (
    assert_accounted,
    engine_config,
    make_prompts,
    token_counter,
)

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
SYSTEM = f"You may call functions. <tools> {json.dumps(TOOLS)} </tools>"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
OTHER_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def _conversation(i: int, kind: str) -> dict:
    if kind == "tool":  # a call, its result, an answer; then a follow-up question
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Rain in city {i}?"},
                    {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": '{"rain": true}'},
                    {"role": "assistant", "content": "Yes."},
                    {"role": "user", "content": "And tomorrow?"},
                    {"role": "assistant", "content": "No."}]
    elif kind == "diverge":  # the original called another function: its result cannot follow
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Time in city {i}?"},
                    {"role": "assistant", "content": OTHER_CALL},
                    {"role": "tool", "content": '{"time": "9:00"}'},
                    {"role": "assistant", "content": "Nine."}]
    else:  # three user turns, no tools
        messages = []
        for k in range(3):
            messages += [{"role": "user", "content": f"Chat {i} question {k}: explain this."},
                         {"role": "assistant", "content": "original answer"}]
    return {"id": f"{kind}:{i}", "source": kind, "metadata": {}, "messages": messages,
            "turns": "all", "call_format": "tool_call"}


def _prompts() -> list[dict]:
    return ([_conversation(i, "tool") for i in range(12)]
            + [_conversation(i, "diverge") for i in range(4)]
            + [_conversation(i, "chat") for i in range(8)] + make_prompts(6))


def test_conversations_are_regenerated_turn_by_turn_exactly_and_stay_on_their_server(
    standins, tokenizer_dir, tmp_path
) -> None:
    logs = tmp_path / "sampled"
    servers = standins(2, standin_tool_call_rate=1.0, enable_cache_report=True,
                       standin_sampled_log_dir=str(logs))
    prompts = _prompts()
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"), engine_config(),
                        token_counter(tokenizer_dir))
    assert_accounted(prompts, outcome.records)
    records = outcome.records
    sampled = read_sampled_log(logs)
    for pid in (p["id"] for p in prompts if p.get("turns") == "all"):
        rec = records[pid]
        assert rec["status"] == "completed" and rec["turn_results"], rec
        for turn in rec["turn_results"]:  # exactly what the server sampled for that prompt
            assert turn["server_version"] == "0.5.23"
            assert turn["response_token_ids"] in sampled[tuple(turn["prompt_token_ids"])]
    tool = records["tool:0"]["turn_results"]
    assert [t["inputs"] for t in tool] == [[0, 2], [3, 4], [5, 6]]
    assert "<tool_call>" in tool[0]["text"] and "<tool_call>" not in tool[1]["text"]
    assert {records[f"tool:{i}"]["end"]["reason"] for i in range(12)} == {"completed"}
    diverged = records["diverge:0"]
    assert diverged["end"]["reason"] == "tool_call_diverged"
    assert len(diverged["turn_results"]) == 1  # the result of a call not made never follows
    assert {len(records[f"chat:{i}"]["turn_results"]) for i in range(8)} == {3}
    conv = outcome.conversations
    assert conv["turns"] == 12 * 3 + 4 + 8 * 3
    assert conv["ends"]["completed"] == 20 and conv["ends"]["tool_call_diverged"] == 4
    # Affinity: later turns go to the server holding the history, whose cache serves it.
    later = [(t["server"], rec["turn_results"][k - 1]["server"])
             for rec in records.values() for k, t in enumerate(rec.get("turn_results", []))
             if k > 0]
    stayed = sum(a == b for a, b in later)
    assert stayed + sum(conv["moved"].values()) >= len(later) and stayed >= 0.7 * len(later)
    assert conv["cached_tokens"] > 0

    # Tokenized: the tool chains' first two turns are prefix-stable (no user turn between).
    data, _ = build_shard_output("shard-00000", prompts, records)
    rows = [json.loads(line) for line in data.splitlines()]
    result = tokenize_completions(load_tokenizer(str(tokenizer_dir)), rows)
    assert not result.quarantined, result.quarantined[:3]
    summary = result.manifest()["conversations"]
    assert summary["conversations"] == 24 and summary["kept_apart"]["not_prefix_stable"] >= 8


def test_a_resumed_shard_continues_each_conversation_at_its_next_turn(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2, standin_tool_call_rate=1.0)
    prompts = [_conversation(i, "chat") for i in range(6)] + \
        [_conversation(i, "tool") for i in range(6)]
    urls = [s.url for s in servers]
    full = run_shard("shard-00000", prompts, urls, FileJournal(tmp_path / "full.jsonl"),
                     engine_config(), token_counter(tokenizer_dir))
    # A worker lost mid-shard: the journal holds only each conversation's first turn.
    lines = (tmp_path / "full.jsonl").read_text().splitlines()
    first_turns = [line for line in lines
                   if json.loads(line).get("kind") == "conversation_turn"
                   and json.loads(line)["turn"] == 0]
    assert len(first_turns) == 12
    (tmp_path / "cut.jsonl").write_text("\n".join(first_turns) + "\n")
    resumed = run_shard("shard-00000", prompts, urls, FileJournal(tmp_path / "cut.jsonl"),
                        engine_config(), token_counter(tokenizer_dir))
    total_turns = full.conversations["turns"]
    assert resumed.requests == total_turns - 12  # no first turn sent again
    for pid, rec in full.records.items():
        again = resumed.records[pid]
        assert [t["response_token_ids"] for t in again["turn_results"]] == \
            [t["response_token_ids"] for t in rec["turn_results"]]
        assert again["end"] == rec["end"]
