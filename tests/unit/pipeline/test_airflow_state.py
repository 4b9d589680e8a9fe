"""What the tasks ask Airflow (``pipeline/airflow_state.py``): whether another run may still
publish a shard (unknown counts as live), and whether a generation slot is free.

Only ``airflow_run_is_live`` is imported for the first (it predates the lease), so its error
case fails on the code before issue 18 by its answer, not by an import."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from include.pipeline import airflow_state
from include.pipeline.airflow_state import airflow_run_is_live, airflow_slot_free


def _task_runner(monkeypatch, runtime_task_instance: type) -> None:
    """Put ``runtime_task_instance`` where the task SDK's ``RuntimeTaskInstance`` is read."""
    module = types.ModuleType("airflow.sdk.execution_time.task_runner")
    module.RuntimeTaskInstance = runtime_task_instance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.task_runner", module)


def _run_state_answering(monkeypatch, answer) -> None:
    """Stand in for the task SDK's ``RuntimeTaskInstance.get_dagrun_state``."""

    class RuntimeTaskInstance:
        @staticmethod
        def get_dagrun_state(dag_id, run_id):
            if isinstance(answer, Exception):
                raise answer
            return answer

    _task_runner(monkeypatch, RuntimeTaskInstance)


class _ApiError(Exception):
    """Shaped like the task SDK's AirflowRuntimeError(ErrorResponse(API_SERVER_ERROR))."""

    def __init__(self, status: int) -> None:
        self.error = types.SimpleNamespace(detail={"status_code": status})
        super().__init__(f"API_SERVER_ERROR: {status}")


@pytest.mark.parametrize(("answer", "live"), [
    ("running", True), ("queued", True), ("success", False), ("failed", False),
    (ConnectionError("api-server down"), True),  # before: False, and a second writer
    (TimeoutError("timed out"), True),
    (_ApiError(500), True),
    (_ApiError(404), False),  # the run was deleted: nothing of it can publish
])
def test_an_airflow_api_error_counts_the_run_as_live(monkeypatch, caplog, answer,
                                                     live) -> None:
    _run_state_answering(monkeypatch, answer)
    with caplog.at_level(logging.INFO, logger=airflow_state.log.name):
        assert airflow_run_is_live("dag")("run-1") is live
    if isinstance(answer, ConnectionError):
        assert "state unknown (api-server down); counting it as live" in caplog.text


def _task_states_answering(monkeypatch, states: dict | Exception) -> list[dict]:
    """Stand in for the task SDK's ``RuntimeTaskInstance.get_task_states``."""
    calls: list[dict] = []

    class RuntimeTaskInstance:
        @staticmethod
        def get_task_states(dag_id, task_ids, run_ids):
            calls.append({"dag_id": dag_id, "task_ids": task_ids, "run_ids": run_ids})
            if isinstance(states, Exception):
                raise states
            return states

    _task_runner(monkeypatch, RuntimeTaskInstance)
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
    calls = _task_states_answering(monkeypatch, {"run-1": states})
    check = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)
    assert check() is free
    assert calls == [{"dag_id": "dag", "task_ids": ["shard.generate"], "run_ids": ["run-1"]}]


def test_airflow_slot_free_starts_when_airflow_cannot_be_asked(monkeypatch, caplog) -> None:
    _task_states_answering(monkeypatch, ConnectionError("api-server down"))
    with caplog.at_level(logging.INFO, logger=airflow_state.log.name):
        assert airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)() is True
    assert "could not ask Airflow which shards are generating (api-server down)" in caplog.text


def test_a_slot_check_says_how_many_slots_there_are_and_which_shards_hold_them(
        monkeypatch) -> None:
    # Issue 27: the slot wait said neither how many slots there are nor who holds them.
    _task_states_answering(monkeypatch, {"run-1": {
        f"shard.generate_{i}": "running" for i in (0, 2, 4, 6)}})
    names = [f"shard-{10 + i:05d}" for i in range(4)]  # the plan covers map indexes 0-3
    check = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3,
                              names=lambda: names)
    assert check() is False and check.held_by == [0, 2, 4]
    assert check.holders() == "3 of 3 slots held by shard-00010, shard-00012, map index 4"
    broken = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3,
                               names=lambda: 1 / 0)
    broken()
    assert broken.holders() == "3 of 3 slots held by map index 0, map index 2, map index 4"
