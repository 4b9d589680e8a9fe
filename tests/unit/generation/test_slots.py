"""Shards queued ahead: set up, they wait for one of the run's generation slots."""

from __future__ import annotations

import logging

from include.generation import shard
from include.generation.shard import wait_for_slot


def test_wait_for_slot_returns_once_a_slot_is_free(monkeypatch, caplog) -> None:
    answers = iter([False, False, True])
    monkeypatch.setattr(shard.time, "sleep", lambda s: None)
    with caplog.at_level(logging.INFO, logger=shard.log.name):
        wait_for_slot("shard-00004", lambda: next(answers), poll_s=0.01)
    assert next(answers, "drained") == "drained"  # asked until it said yes, not after
    assert "shard-00004: set up and queued ahead; waiting for a generation slot" in caplog.text
    assert "shard-00004: a generation slot freed after" in caplog.text


def test_wait_for_slot_starts_anyway_after_its_timeout(caplog) -> None:
    with caplog.at_level(logging.INFO, logger=shard.log.name):
        wait_for_slot("shard-00007", lambda: False, poll_s=0.01, timeout_s=0.05)
    assert "shard-00007: no generation slot freed in 0s; starting anyway" in caplog.text


class _Slots:
    """A slot check that also says who holds the slots (as Airflow's SlotCheck does)."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = iter(answers)

    def __call__(self) -> bool:
        return next(self.answers)

    def holders(self) -> str:
        return "2 of 2 slots held by shard-00000, shard-00001"


def test_the_wait_says_how_many_slots_there_are_and_who_holds_them(monkeypatch,
                                                                    caplog) -> None:
    clock = iter(range(0, 1000, 30))
    monkeypatch.setattr(shard.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(shard.time, "sleep", lambda s: None)
    with caplog.at_level(logging.INFO, logger=shard.log.name):
        wait_for_slot("shard-00004", _Slots([False, False, False, False, True]), poll_s=0.01,
                      say_every_s=60)
    assert ("shard-00004: set up and queued ahead; waiting for a generation slot (2 of 2 "
            "slots held by shard-00000, shard-00001)") in caplog.text
    assert "shard-00004: still waiting for a generation slot after" in caplog.text
