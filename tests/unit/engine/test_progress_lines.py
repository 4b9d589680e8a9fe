"""A shard logs its first progress line soon after its first answers, then one per interval
(issue 27: with the default interval a short shard printed no progress line at all; issue 34:
a line at 1 s said "0/20 finished", and 20-prompt shards then said nothing for 12-16 s)."""

from __future__ import annotations

import asyncio

import pytest

from include.durability.journal import FileJournal
from include.engine import tally as tally_module
from include.engine.tally import FIRST_ANSWER_POLL_S, Tally


def _lines(tmp_path, monkeypatch, first_answer_at: float | None) -> tuple[list, list]:
    """Run the progress loop on a fake clock (the sum of its sleeps); the first answer lands
    at ``first_answer_at`` seconds. Return (the sleeps, what each line saw)."""
    tally = Tally("shard-00000", FileJournal(tmp_path / "j.jsonl"), {})
    slept: list[float] = []
    lines: list[tuple[float, int]] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if first_answer_at is not None and sum(slept) >= first_answer_at:
            tally.completed_here = 1
        if len(lines) == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(tally_module.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(tally.progress_lines(30.0, lambda: lines.append(
            (sum(slept), tally.completed_here))))
    return slept, lines


def test_the_first_line_follows_the_first_answers_then_every_interval(tmp_path,
                                                                       monkeypatch) -> None:
    _, lines = _lines(tmp_path, monkeypatch, first_answer_at=3.1)
    # Within a poll of the first answer, with that answer in it; then every 30 s.
    assert lines == [(3.25, 1), (33.25, 1), (63.25, 1)]
    assert FIRST_ANSWER_POLL_S <= 0.5


def test_with_no_answer_the_first_line_comes_after_one_interval(tmp_path, monkeypatch) -> None:
    _, lines = _lines(tmp_path, monkeypatch, first_answer_at=None)
    assert lines == [(30.0, 0), (60.0, 0), (90.0, 0)]  # never a silence longer than the interval
