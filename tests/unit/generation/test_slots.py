"""Shards queued ahead: set up, they wait for one of the run's generation slots."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from include.generation import shard
from include.generation.shard import wait_for_slot
from include.pipeline import airflow_state
from include.pipeline.airflow_state import airflow_slot_free


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


def _airflow_answering(monkeypatch, states: dict | Exception) -> list[dict]:
    """Stand in for the task SDK's ``RuntimeTaskInstance.get_task_states``."""
    calls: list[dict] = []

    class RuntimeTaskInstance:
        @staticmethod
        def get_task_states(dag_id, task_ids, run_ids):
            calls.append({"dag_id": dag_id, "task_ids": task_ids, "run_ids": run_ids})
            if isinstance(states, Exception):
                raise states
            return states

    module = types.ModuleType("airflow.sdk.execution_time.task_runner")
    module.RuntimeTaskInstance = RuntimeTaskInstance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.task_runner", module)
    return calls


@pytest.mark.parametrize(("states", "free"), [
    # Three earlier shards generating: shard 5 waits.
    ({f"shard.generate_{i}": "running" for i in (0, 2, 4)}, False),
    # Later shards (queued ahead too) and finished ones do not count: the earliest waiting
    # shard goes first and no two wait for each other.
    ({"shard.generate_0": "success", "shard.generate_2": "running",
      "shard.generate_4": "running", "shard.generate_6": "running",
      "shard.generate_7": "running", "shard.upload_1": "running"}, True),
    ({}, True),
])
def test_airflow_slot_free_counts_the_earlier_shards_generating(monkeypatch, states,
                                                                 free) -> None:
    calls = _airflow_answering(monkeypatch, {"run-1": states})
    check = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)
    assert check() is free
    assert calls == [{"dag_id": "dag", "task_ids": ["shard.generate"], "run_ids": ["run-1"]}]


def test_airflow_slot_free_starts_when_airflow_cannot_be_asked(monkeypatch, caplog) -> None:
    _airflow_answering(monkeypatch, ConnectionError("api-server down"))
    with caplog.at_level(logging.INFO, logger=airflow_state.log.name):
        assert airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)() is True
    assert "could not ask Airflow which shards are generating (api-server down)" in caplog.text
