"""Engine paths that must never turn a prompt into a wrong final record."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace
from typing import Any

import pytest

from include.durability.journal import FileJournal
from include.engine import client as c
from include.engine.dispatch import EngineConfig, _ShardGeneration
from include.engine.planning import Planner
from include.engine.retry import Verdict
from include.engine.tally import Tally
from include.engine.turns import Item

#: These runs send nothing: no session is needed.
NO_SESSION: Any = None


def _config() -> EngineConfig:
    return EngineConfig(model="m", context_length=4096, max_tokens=64, context_margin=16,
                        min_completion_tokens=8, sampling={"temperature": 0, "top_p": 1},
                        concurrency_mode="fixed", in_flight_per_server=1)


def _prompt(i: int) -> dict:
    return {"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}


def test_every_verdict_has_its_handler(tmp_path) -> None:
    run = _ShardGeneration("shard-00000", [], lambda convs: [5] * len(convs), ["http://s"],
               FileJournal(tmp_path / "j.jsonl"), _config(), NO_SESSION)
    assert set(run.on_verdict) == set(Verdict)


def test_a_401_mid_run_stops_without_recording_the_prompt_as_failed(tmp_path) -> None:
    journal = FileJournal(tmp_path / "j.jsonl")
    run = _ShardGeneration("shard-00000", [_prompt(0)], lambda convs: [5] * len(convs), ["http://s"],
               journal, _config(), NO_SESSION)
    item = Item(_prompt(0), 5, 64, attempts=1)
    result = c.ChatResult(server="http://s", status=401, error_kind=c.ErrorKind.UNAUTHORIZED,
                          error="Unauthorized")
    run._apply(result, run.pool.servers[0], item, 1)
    journal.close()
    assert run.fatal and "REGEN_SGLANG_CONN_ID" in run.fatal
    assert FileJournal(tmp_path / "j.jsonl").load() == {}
    assert list(run.pending) == [item] and item.charged == 0


def test_a_failing_tokenizer_loses_no_prompt(tmp_path) -> None:
    def broken(convs):
        raise RuntimeError("template error")

    tally = Tally("shard-00000", FileJournal(tmp_path / "j.jsonl"), {})
    pending: collections.deque[Item] = collections.deque()
    planner = Planner(_config(), broken, tally, pending, None)
    planner.unplanned.extend(_prompt(i) for i in range(3))
    with pytest.raises(RuntimeError, match="template error"):
        planner.plan_more()
    assert [p["id"] for p in planner.unplanned] == ["p0", "p1", "p2"]
    assert not pending and not tally.records


def test_a_finished_request_is_replaced_by_its_own_callback_not_by_the_loop(
        tmp_path, monkeypatch) -> None:
    # The refill must not wait for the loop's next turn: that cost a third of the servers'
    # throughput (benchmarks/bench_saturation.py). The loop never runs here.
    sent: list[str] = []

    async def answer(session, url, request, headers, timeout) -> c.ChatResult:
        sent.append(request.prompt_id)
        await asyncio.sleep(0)
        return c.ChatResult(ok=True, server=url, text="a", finish_reason="stop",
                            usage={"completion_tokens": 1})

    monkeypatch.setattr(c, "send_chat", answer)

    async def scenario() -> None:
        session: Any = SimpleNamespace(timeout=None)  # answer() stands in for the HTTP call
        run = _ShardGeneration("shard-00000", [], lambda convs: [5] * len(convs), ["http://s"],
                   FileJournal(tmp_path / "j.jsonl"), _config(), session)
        run.pending.extend(Item(_prompt(i), 5, 64) for i in range(3))
        run._plan_and_send()  # a window of one: one request goes
        assert run.tally.requests == 1 and run.in_flight == 1
        for _ in range(20):
            await asyncio.sleep(0)
        assert sent == ["p0", "p1", "p2"] and set(run.tally.records) == {"p0", "p1", "p2"}

    asyncio.run(scenario())
