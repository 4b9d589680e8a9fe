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
    """Stand in for the task SDK's ``get_task_states`` and ``get_ti_count``, answering as the
    execution API does (``routes/task_instances.py``: filters on task ids, run ids and one
    map index; keys ``<task_id>_<map_index>``); ``calls`` records every question."""
    calls: list[dict] = []

    def matching(task_ids, run_ids, map_index=None):
        if isinstance(states, Exception):
            raise states
        for run_id, tis in states.items():
            for key, state in tis.items():
                task_id, _, index = key.rpartition("_")
                if (run_id in run_ids and task_id in task_ids
                        and (map_index is None or int(index) == map_index)):
                    yield run_id, key, state

    class RuntimeTaskInstance:
        @staticmethod
        def get_task_states(dag_id, map_index=None, task_ids=None, run_ids=None):
            calls.append({"states": dag_id, "map_index": map_index, "task_ids": task_ids,
                          "run_ids": run_ids})
            out: dict[str, dict] = {}
            for run_id, key, state in matching(task_ids, run_ids, map_index):
                out.setdefault(run_id, {})[key] = state
            return out

        @staticmethod
        def get_ti_count(dag_id, task_ids=None, run_ids=None, states=None):
            calls.append({"count": dag_id, "task_ids": task_ids, "run_ids": run_ids,
                          "states": states})
            return sum(s in states for _, _, s in matching(task_ids, run_ids))

    _task_runner(monkeypatch, RuntimeTaskInstance)
    return calls


def _running(*indexes: int, me: int = 5) -> dict:
    """The run's generate states: ``indexes`` and this shard (``me``) running."""
    return {f"shard.generate_{i}": "running" for i in (*indexes, me)}


@pytest.mark.parametrize(("states", "free"), [
    # Three earlier shards generating: shard 5 waits.
    (_running(0, 2, 4), False),
    # Later shards (queued ahead too) and finished ones do not count: the earliest waiting
    # shard goes first and no two wait for each other.
    ({"shard.generate_0": "success", "shard.generate_2": "running",
      "shard.generate_4": "running", "shard.generate_6": "running",
      "shard.generate_7": "running", "shard.upload_1": "running", "shard.generate_5": "running"},
     True),
    ({}, True),
])
def test_airflow_slot_free_counts_the_earlier_shards_generating(monkeypatch, states,
                                                                 free) -> None:
    calls = _task_states_answering(monkeypatch, {"run-1": states})
    check = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)
    assert check() is free
    assert all(c["task_ids"] == ["shard.generate"] and c["run_ids"] == ["run-1"]
               for c in calls)


def test_a_poll_costs_the_same_however_many_shards_the_run_has(monkeypatch) -> None:
    # Issue 28: every poll listed all the run's shards (1,600 ORM rows at the published size,
    # twice a second per waiting shard). Now a count, then the states of the shards just
    # below, one index each: the same questions at 1,600 shards as at 10.
    finished = {f"shard.generate_{i}": "success" for i in range(1600)}
    asked = []
    for holders, me in (((597, 598, 599), 600), ((1596, 1597, 1598), 1599)):
        calls = _task_states_answering(monkeypatch, {"run-1": {
            **finished, **_running(*holders, me + 1, me=me)}})
        check = airflow_slot_free("dag", "shard.generate", "run-1", me, slots=3)
        assert check() is False and check.held_by == list(holders)
        assert all(c.get("map_index") is not None for c in calls if "map_index" in c)
        asked.append(len(calls))
    assert asked == [4, 4]  # the count, then shards 599, 598, 597 (or 1598, 1597, 1596)


def test_a_free_slot_is_known_from_the_count_alone(monkeypatch) -> None:
    calls = _task_states_answering(monkeypatch, {"run-1": _running(0, 1)})
    assert airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)() is True
    assert [c.get("count") for c in calls] == ["dag"]


@pytest.mark.parametrize(("holders", "free", "listed"), [
    # A retry of shard 40 generates far below shard 600, and the shards queued ahead are
    # later ones: the scan finds no holder near, so the poll lists the run once.
    ((40, 601, 602, 603), True, True),
    ((40, 41, 42, 601), False, True),
    # Near the start of the run the scan reaches map index 0 and needs no listing.
    ((0, 7, 8), True, False),
])
def test_a_holder_far_below_is_found_by_one_listing(monkeypatch, holders, free,
                                                    listed) -> None:
    me = 600 if holders[0] >= 40 else 3
    calls = _task_states_answering(monkeypatch, {"run-1": _running(*holders, me=me)})
    check = airflow_slot_free("dag", "shard.generate", "run-1", me, slots=3)
    assert check() is free
    assert check.held_by == [h for h in holders if h < me]
    assert any(c.get("states") == "dag" and c["map_index"] is None for c in calls) is listed
    assert len(calls) <= 1 + check.scan + 1


def test_airflow_slot_free_starts_when_airflow_cannot_be_asked(monkeypatch, caplog) -> None:
    _task_states_answering(monkeypatch, ConnectionError("api-server down"))
    with caplog.at_level(logging.INFO, logger=airflow_state.log.name):
        assert airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3)() is True
    assert "could not ask Airflow which shards are generating (api-server down)" in caplog.text


def test_a_slot_check_says_how_many_slots_there_are_and_which_shards_hold_them(
        monkeypatch) -> None:
    # Issue 27: the slot wait said neither how many slots there are nor who holds them.
    _task_states_answering(monkeypatch, {"run-1": _running(0, 2, 4, 6)})
    names = [f"shard-{10 + i:05d}" for i in range(4)]  # the plan covers map indexes 0-3
    check = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3,
                              names=lambda: names)
    assert check() is False and check.held_by == [0, 2, 4]
    assert check.holders() == "3 of 3 slots held by shard-00010, shard-00012, map index 4"
    broken = airflow_slot_free("dag", "shard.generate", "run-1", 5, slots=3,
                               names=lambda: 1 / 0)
    broken()
    assert broken.holders() == "3 of 3 slots held by map index 0, map index 2, map index 4"
