"""Whole conversations (``turns: all``) under faults, against real stand-in processes.

A server killed mid-conversation: its conversations move to the others and go on from the
turn they had reached, every journaled turn being what a live server sampled for that exact
prompt, none journaled twice. A turn that keeps failing ends its conversation ``failed``
after the turns before it (a ``completed`` record, retryable), and a re-run of the shard
continues it at that turn.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from aiohttp import web

from include.durability.journal import FileJournal
from include.engine.dispatch import run_shard
from sglang_standin.testing import read_sampled_log
from tests.integration.generation.faultproxy import FaultProxy
from tests.integration.generation.helpers import (
    assert_accounted,
    engine_config,
    token_counter,
)

pytestmark = pytest.mark.integration

#: What makes the proxy answer a chat completion 500, whichever server is behind it.
POISON = "poisoned question"
TURNS = 4
#: The stand-ins' context and a cap far above their answers (median 40 tokens): every chain
#: runs to its last turn, none is cut by max_tokens.
ROOMY = {"context_length": 32768, "max_tokens": 2048}


def _chat(i: int, poisoned_turn: int | None = None) -> dict:
    """Return a conversation of TURNS user turns (no tools); one may hold the poison."""
    messages = []
    for k in range(TURNS):
        words = POISON if k == poisoned_turn else f"Chat {i} question {k}: explain this."
        messages += [{"role": "user", "content": words},
                     {"role": "assistant", "content": "original answer"}]
    return {"id": f"chat:{i}", "source": "chat", "metadata": {}, "messages": messages,
            "turns": "all", "call_format": "tool_call"}


def _journal(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _turns_journaled(lines: list[dict]) -> Counter:
    return Counter((r["conversation_id"], r["turn"]) for r in lines
                   if r.get("kind") == "conversation_turn")


def _killed_mid_conversation(standins, tokenizer_dir, tmp_path):
    """Run 30 conversations of TURNS turns on two stand-ins and one that dies mid-way;
    return the outcome, the prompts, the dead server's url, the journal and sampled logs."""
    logs = tmp_path / "sampled"
    healthy = standins(2, standin_sampled_log_dir=str(logs))
    # Dies when its 31st request arrives: mid-way through its conversations' chains.
    dying = standins(1, standin_crash_after_requests=30, standin_sampled_log_dir=str(logs))
    prompts = [_chat(i) for i in range(30)]
    journal = tmp_path / "j.jsonl"
    outcome = run_shard("shard-00000", prompts, [s.url for s in healthy + dying],
                        FileJournal(journal), engine_config(**ROOMY),
                        token_counter(tokenizer_dir))
    assert not dying[0].is_alive()
    return outcome, prompts, dying[0].url, _journal(journal), read_sampled_log(logs)


def _last_on(records: dict, url: str) -> dict[str, int]:
    """Return, per conversation, the index of the last of its turns ``url`` answered."""
    return {pid: t["index"] for pid, rec in records.items() for t in rec["turn_results"]
            if t["server"] == url}


def test_a_server_killed_mid_conversation_moves_its_conversations_losing_and_repeating_nothing(
    standins, tokenizer_dir, tmp_path
) -> None:
    outcome, prompts, dead, lines, sampled = _killed_mid_conversation(
        standins, tokenizer_dir, tmp_path)
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"] == {"completed": 30, "skipped": 0, "failed": 0}
    records = outcome.records
    for pid, rec in records.items():
        assert rec["end"]["reason"] == "completed", (pid, rec["end"])
        turns = rec["turn_results"]
        assert [t["index"] for t in turns] == list(range(TURNS))
        for turn in turns:  # exactly what a server sampled for that exact prompt
            assert turn["response_token_ids"] in sampled[tuple(turn["prompt_token_ids"])]
    # Each turn journaled once: none lost with the dead server, none answered twice.
    assert _turns_journaled(lines) == Counter(
        {(p["id"], k): 1 for p in prompts for k in range(TURNS)})
    assert outcome.conversations["turns"] == 30 * TURNS
    # Every request was a turn's first try or a logged, counted retry (of one lost in flight).
    assert outcome.requests == 30 * TURNS + sum(outcome.retries.values()), outcome.retries
    assert sum(outcome.retries.values()) > 0
    assert +Counter(outcome.conversations["ends"]) == {"completed": 30}

    last_on_dead = _last_on(records, dead)
    assert last_on_dead, "the dying server answered no turn before it died"
    # Conversations whose history was on the dead server went on elsewhere, at their next turn.
    moved_on = {pid for pid, k in last_on_dead.items() if k < TURNS - 1}
    assert moved_on, last_on_dead
    for pid in moved_on:
        after = [t["server"] for t in records[pid]["turn_results"][last_on_dead[pid] + 1:]]
        assert after and dead not in after, (pid, after)


def test_every_turn_that_left_the_dead_servers_history_is_counted_as_moved(
    standins, tokenizer_dir, tmp_path
) -> None:
    outcome, _, dead, _, _ = _killed_mid_conversation(standins, tokenizer_dir, tmp_path)
    records = outcome.records
    left_dead = sum(1 for pid, k in _last_on(records, dead).items() if k < TURNS - 1)
    assert left_dead > 0
    moved = outcome.conversations["moved"]
    # A turn placed between the kill and the ejection can leave the dead server as far busier
    # (its requests stalled there): counted as moved too, for that reason (CI saw one).
    assert sum(moved.get(r, 0) for r in ("ejected", "resting", "gone", "busier")
               ) >= left_dead, moved
    changed = sum(t["server"] != rec["turn_results"][t["index"] - 1]["server"]
                  for rec in records.values() for t in rec["turn_results"] if t["index"] > 0)
    assert sum(moved.values()) >= changed, (moved, changed)


class PoisonProxy(FaultProxy):
    """Answers 500 to any chat completion whose messages hold ``POISON``, at every try."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/chat/completions" and POISON.encode() in await request.read():
            return web.json_response({"object": "error", "message": "Internal Server Error",
                                      "type": "InternalServerError", "code": 500}, status=500)
        return await super()._handle(request)


def test_a_turn_that_keeps_failing_ends_its_conversation_failed_and_a_rerun_continues_it(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2)
    proxies = [PoisonProxy(s.url).start() for s in servers]
    # chat:0's third user turn always fails; its first two turns are fine.
    prompts = [_chat(0, poisoned_turn=2)] + [_chat(i) for i in range(1, 8)]
    journal = tmp_path / "j.jsonl"
    config = engine_config(max_attempts=3, **ROOMY)
    try:
        first = run_shard("shard-00000", prompts, [p.url for p in proxies],
                          FileJournal(journal), config, token_counter(tokenizer_dir))
    finally:
        for proxy in proxies:
            proxy.stop()
    assert_accounted(prompts, first.records)
    failed = first.records["chat:0"]
    assert failed["status"] == "completed"  # its two turns are exact rows
    assert [t["index"] for t in failed["turn_results"]] == [0, 1]
    assert failed["end"]["reason"] == "failed" and failed["end"]["retryable"] is True
    assert "http_5xx" in failed["end"]["detail"]
    assert +Counter(first.conversations["ends"]) == {"completed": 7, "failed": 1}
    assert all(first.records[f"chat:{i}"]["end"]["reason"] == "completed" for i in range(1, 8))

    # The re-run (servers fixed: no proxy) continues chat:0 at turn 2; the rest is done.
    again = run_shard("shard-00000", prompts, [s.url for s in servers], FileJournal(journal),
                      config, token_counter(tokenizer_dir))
    assert again.resumed == 7
    assert again.requests == TURNS - 2  # turns 2 and 3 of chat:0, nothing sent twice
    resumed = again.records["chat:0"]
    assert resumed["status"] == "completed" and resumed["end"]["reason"] == "completed"
    assert [t["index"] for t in resumed["turn_results"]] == list(range(TURNS))
    assert resumed["turn_results"][:2] == failed["turn_results"]
    assert again.conversations["turns"] == TURNS - 2
    assert_accounted(prompts, again.records)
    # In the journal: each turn of chat:0 once; its final record is the last line of its id.
    lines = _journal(journal)
    assert _turns_journaled(lines) == Counter(
        {(p["id"], k): 1 for p in prompts for k in range(TURNS)})
    finals = [r for r in lines if r["id"] == "chat:0"]
    assert [r["end"]["reason"] for r in finals] == ["failed", "completed"]
