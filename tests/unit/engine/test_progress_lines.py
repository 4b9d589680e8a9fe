"""A shard logs a progress line soon after it starts, whatever its progress interval (issue 27:
with the default interval a short shard printed no progress line at all)."""

from __future__ import annotations

import asyncio

from include.durability.journal import FileJournal
from include.engine import dispatch as engine
from include.engine.dispatch import EngineConfig, _Run


def test_the_first_progress_line_comes_within_a_second_then_every_interval(tmp_path,
                                                                          monkeypatch) -> None:
    config = EngineConfig(model="m", context_length=4096, max_tokens=64, context_margin=16,
                          min_completion_tokens=8, sampling={"temperature": 0, "top_p": 1},
                          progress_interval_s=30.0)
    run = _Run("shard-00000", [], lambda convs: [5] * len(convs), ["http://s"],
               FileJournal(tmp_path / "j.jsonl"), config)
    slept: list[float] = []
    lines: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(engine.asyncio, "sleep", sleep)
    monkeypatch.setattr(run, "_log_progress", lambda final=False: lines.append(sum(slept)))
    try:
        asyncio.run(run._progress_loop())
    except asyncio.CancelledError:
        pass
    assert slept == [1.0, 30.0, 30.0] and lines == [1.0, 31.0]
