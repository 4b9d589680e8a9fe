"""Engine paths that must never turn a prompt into a wrong final record."""

from __future__ import annotations

import pytest

from include.durability.journal import FileJournal
from include.engine import client as c
from include.engine.dispatch import EngineConfig, _Run
from include.engine.pool import ServerPool
from include.engine.turns import Item


def _config() -> EngineConfig:
    return EngineConfig(model="m", context_length=4096, max_tokens=64, context_margin=16,
                        min_completion_tokens=8, sampling={"temperature": 0, "top_p": 1})


def _prompt(i: int) -> dict:
    return {"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}


def test_a_401_mid_run_stops_without_recording_the_prompt_as_failed(tmp_path) -> None:
    journal = FileJournal(tmp_path / "j.jsonl")
    run = _Run("shard-00000", [_prompt(0)], lambda convs: [5] * len(convs), ["http://s"],
               journal, _config())
    run.pool = ServerPool(["http://s"], mode="fixed", start_window=1, min_window=1,
                          max_window=1, cool_down_after_failures=3, health_interval_s=1)
    item = Item(_prompt(0), 5, 64, attempts=1)
    result = c.ChatResult(server="http://s", status=401, error_kind=c.ErrorKind.UNAUTHORIZED,
                          error="Unauthorized")
    run._handle(result, run.pool.servers[0], item, 1)
    journal.close()
    assert run.fatal and "REGEN_SGLANG_CONN_ID" in run.fatal
    assert FileJournal(tmp_path / "j.jsonl").load() == {}
    assert list(run.pending) == [item] and item.charged == 0


def test_a_failing_tokenizer_loses_no_prompt(tmp_path) -> None:
    def broken(convs):
        raise RuntimeError("template error")

    run = _Run("shard-00000", [], broken, ["http://s"], FileJournal(tmp_path / "j.jsonl"),
               _config())
    run.pool = ServerPool(["http://s"], mode="fixed", start_window=1, min_window=1,
                          max_window=1, cool_down_after_failures=3, health_interval_s=1)
    run.unplanned.extend(_prompt(i) for i in range(3))
    with pytest.raises(RuntimeError, match="template error"):
        run._plan_more()
    assert [p["id"] for p in run.unplanned] == ["p0", "p1", "p2"]
    assert not run.pending and not run.tally.records
