"""Airflow's side of the monitor: shard classes from task states, UI links, page sections."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from include.dag_names import SHARD_TASKS
from include.monitor.states import (
    FILE_WORDS,
    NO_STATUS,
    STATE_ORDER,
    TaskRow,
    attach,
    classify_shard,
    first_failure,
    page_order,
    run_path,
    summarize_run,
    task_log_path,
    ui_words,
)

DAG = "regenerate_drafter_data"
RUN = "manual__2026-05-01T10:00:00.123+00:00"
GEN, UP, TOK = SHARD_TASKS


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({GEN: "success", UP: "success", TOK: "success"}, ("success", GEN)),
        ({GEN: "running", UP: None, TOK: None}, ("running", GEN)),
        ({GEN: "success", UP: "success", TOK: "running"}, ("running", TOK)),
        # Airflow's own state, whatever it is: never one of ours in its place.
        ({GEN: "queued"}, ("queued", GEN)),
        ({GEN: "scheduled"}, ("scheduled", GEN)),
        ({GEN: "deferred"}, ("deferred", GEN)),
        ({GEN: "up_for_retry"}, ("up_for_retry", GEN)),
        ({}, (NO_STATUS, GEN)),  # expanded, not scheduled yet
        # Generated, the upload not scheduled yet: its state, not the generate task's.
        ({GEN: "success", UP: None, TOK: None}, (NO_STATUS, UP)),
        ({GEN: "failed", UP: "upstream_failed", TOK: "upstream_failed"}, ("failed", GEN)),
        ({GEN: "success", UP: "upstream_failed"}, ("upstream_failed", UP)),
        ({GEN: "success", UP: "skipped", TOK: "skipped"}, ("skipped", UP)),
        ({GEN: "removed", UP: "removed", TOK: "removed"}, None),
    ],
)
def test_a_shard_is_in_its_first_unfinished_tasks_airflow_state(states, expected) -> None:
    assert classify_shard(states) == expected


def test_links_are_the_ui_routes_of_a_run_and_of_a_mapped_task_log() -> None:
    assert run_path(DAG, RUN) == (
        "/dags/regenerate_drafter_data/runs/manual__2026-05-01T10%3A00%3A00.123%2B00%3A00")
    assert task_log_path(DAG, "a/b c", "shard.generate", 7) == (
        "/dags/regenerate_drafter_data/runs/a%2Fb%20c/tasks/shard.generate/mapped/7")


def test_the_links_follow_the_installed_airflow_ui_routes() -> None:
    import airflow

    bundles = list((Path(airflow.__file__).parent / "ui" / "dist" / "assets").glob("index-*.js"))
    routes = {m for b in bundles for m in re.findall(r"path:`(dags/[^`]*)`", b.read_text())}
    # Fixed words at even positions, values at odd ones: dags/<dag>/runs/<run>/...
    shape = {"/".join("x" if i % 2 else part for i, part in enumerate(p.strip("/").split("/")))
             for p in (run_path(DAG, RUN), task_log_path(DAG, RUN, GEN, 3))}
    ui = {re.sub(r":\w+", "x", r) for r in routes}
    assert "dags/x/runs/x" in ui and "dags/x/runs/x/tasks/x/mapped/x" in ui, sorted(routes)
    assert shape == {"dags/x/runs/x", "dags/x/runs/x/tasks/x/mapped/x"}


def _rows(spec: dict[int, dict[str, str | None]], named: set[int]) -> list[TaskRow]:
    """Task rows as Airflow returns them: a started task carries its shard's name."""
    return [TaskRow(task, i, state, f"shard-{i:05d}" if i in named and state else str(i))
            for i, states in spec.items() for task, state in states.items()]


def test_a_run_lists_its_shards_by_airflow_state_with_names_and_log_links() -> None:
    spec = {0: {GEN: "success", UP: "success", TOK: "success"},
            1: {GEN: "running", UP: None, TOK: None},
            2: {GEN: "failed", UP: "upstream_failed", TOK: "upstream_failed"},
            3: {GEN: None, UP: None, TOK: None},
            4: {GEN: "removed", UP: "removed", TOK: "removed"},
            5: {GEN: "queued", UP: None, TOK: None}}
    plan = [{"shard_id": f"shard-{10 + i:05d}", "outputs_uri": "s3://b/runs/exp1",
             "wait_for": None} for i in range(5)]
    run = {"run_id": RUN, "state": "running", "conf": {"run_name": "exp1"},
           "start_date": "2026-05-01T10:00:01+00:00"}
    failure = {"task_id": GEN, "map_index": 2, "message": "GenerationError: all servers down",
               "lines": []}
    out = summarize_run(DAG, run, _rows(spec, named={0, 1, 2}), plan, ui_base="/airflow",
                        failure=failure)
    assert (out["run_name"], out["location"], out["state"]) == ("exp1", ".", "running")
    assert out["url"] == "/airflow" + run_path(DAG, RUN)
    # Counted by Airflow's states, what needs attention first, done last.
    assert out["shard_counts"] == {"failed": 1, "running": 1, "queued": 1, NO_STATUS: 1,
                                   "success": 1}
    assert list(out["shards"]) == list(out["shard_counts"])
    # The grid's name when the task started; the plan's shard for one not started; the map
    # index when neither is known (the plan lists fewer shards than were mapped).
    assert [s["shard_id"] for s in out["shards"][NO_STATUS]] == ["shard-00013"]
    assert [s["shard_id"] for s in out["shards"]["queued"]] == ["#5"]
    running = out["shards"]["running"][0]
    assert running == {"shard_id": "shard-00001", "map_index": 1, "task": GEN,
                       "state": "running",
                       "url": "/airflow" + task_log_path(DAG, RUN, GEN, 1)}
    assert out["shards"]["failed"][0]["shard_id"] == "shard-00002"
    assert out["shards"]["success"][0]["url"].endswith("/tasks/shard.generate/mapped/0")
    assert out["failure"] == {**failure, "shard_id": "shard-00002",
                              "url": "/airflow" + task_log_path(DAG, RUN, GEN, 2)}


def test_a_run_before_its_plan_uses_the_default_run_name_and_the_run_folder() -> None:
    run = {"run_id": "r1", "state": "queued", "conf": {}, "start_date": None}
    out = summarize_run(DAG, run, [], None, default_run_name="local")
    assert (out["run_name"], out["location"]) == ("local", ".")
    assert out["shard_counts"] == {} and out["failure"] is None
    # An emptied form field (None) means the default as well.
    none = summarize_run(DAG, {**run, "conf": {"run_name": None}}, [], None)
    assert none["run_name"] == "local"


def test_runs_attach_to_their_run_folder_and_outputs_location() -> None:
    forced_plan = [{"shard_id": "shard-00000",
                    "outputs_uri": "s3://b/runs/exp1/regenerations/manual_2", "wait_for": None}]
    main = summarize_run(DAG, {"run_id": "manual_1", "state": "success",
                               "conf": {"run_name": "exp1"}}, [], [])
    forced = summarize_run(DAG, {"run_id": "manual_2", "state": "running",
                                 "conf": {"run_name": "exp1", "force_regenerate": True}},
                           [], forced_plan)
    early = summarize_run(DAG, {"run_id": "manual_3", "state": "queued",
                                "conf": {"run_name": "exp2"}}, [], None)
    assert forced["location"] == "regenerations/manual_2"
    page = [{"run_name": "exp1", "locations": [{"location": "."},
                                               {"location": "regenerations/manual_2"}]}]
    runs, others = attach(page, [forced, main, early])
    assert [[a["run_id"] for a in loc["airflow_runs"]] for loc in runs[0]["locations"]] == [
        ["manual_1"], ["manual_2"]]
    assert [a["run_id"] for a in others] == ["manual_3"]
    assert "airflow_runs" not in page[0]["locations"][0]  # the cached states stay as they were


def test_a_failed_attempts_reason_is_its_exception_and_our_error_lines_before_it() -> None:
    events = [
        {"event": "DAG bundles loaded", "level": "info", "logger": "airflow.dag_processing"},
        {"event": "1 setting refused:", "level": "error",
         "logger": "include.pipeline.check_settings"},
        {"event": "1. setting `model_path`: got 'x'", "level": "error",
         "logger": "include.pipeline.check_settings"},
        {"event": "Something else failed", "level": "error", "logger": "airflow.task"},
        {"event": "Task failed with exception", "level": "error", "logger": "task",
         "error_detail": [{"exc_type": "AirflowFailException", "exc_value": "1 setting refused",
                           "frames": [{"name": "run"}] * 13}]},
        {"event": "later", "level": "error", "logger": "include.pipeline.check_settings"},
    ]
    assert first_failure(events) == ("1 setting refused", [
        "1 setting refused:", "1. setting `model_path`: got 'x'"])
    crash = [{"event": "Task failed with exception", "level": "error", "error_detail": [
        {"exc_type": "GenerationError", "exc_value": "every server is ejected"}]}]
    assert first_failure(crash) == ("GenerationError: every server is ejected", [])
    assert first_failure([]) == ("", [])


def test_a_refusals_reason_is_its_exit_line() -> None:
    """Issue 34, item 3: a refusal fails with no traceback; Airflow logs it as one line."""
    events = [
        {"event": "2 settings refused:", "level": "error", "logger": "include.pipeline.refusal"},
        {"event": "1. setting `model_path`: got 'x'", "level": "error",
         "logger": "include.pipeline.refusal"},
        {"event": "Task exited", "level": "error", "logger": "task",
         "exit_code": "2 settings refused: model_path, run_name (the reasons are in this "
                      "task's log)"},
        {"event": "Retry policy decision", "level": "info", "logger": "task"},
    ]
    assert first_failure(events) == (
        "2 settings refused: model_path, run_name (the reasons are in this task's log)",
        ["2 settings refused:", "1. setting `model_path`: got 'x'"])
    # A task that called sys.exit(1) itself is no refusal: its number is not a reason.
    assert first_failure([{"event": "Task exited", "level": "error", "exit_code": 1}]) == (
        "", [])


def _section(name: str, state: str | None, start: str | None) -> dict:
    runs = [] if state is None else [{"state": state, "start_date": start,
                                      "live": state in ("running", "queued")}]
    return {"run_name": name, "airflow_runs": runs}


def test_sections_list_live_runs_first_then_newest_first() -> None:
    # Issue 27: runs were sorted by name, so the live run sat below finished ones.
    sections = [_section("a_old", "success", "2026-05-01T09:00:00+00:00"),
                _section("b_none", None, None),
                _section("c_live", "running", "2026-05-01T08:00:00+00:00"),
                _section("d_new", "failed", "2026-05-01T10:00:00+00:00"),
                _section("e_queued", "queued", None)]
    assert [s["run_name"] for s in page_order(sections)] == [
        "c_live", "e_queued", "d_new", "a_old", "b_none"]


def test_the_words_are_airflow_uis_for_every_airflow_state() -> None:
    from airflow.utils.state import DagRunState, TaskInstanceState

    values = [*(s.value for s in TaskInstanceState), *(s.value for s in DagRunState)]
    words = ui_words(values, {"up_for_retry": "Up For Retry", "no_status": "No Status"})
    assert set(words) == {*values, NO_STATUS}
    assert words["up_for_retry"] == "Up For Retry" and words[NO_STATUS] == "No Status"
    assert words["running"] == "Running"  # spelled as the UI does when its table lacks it
    # The page lists shards by Airflow's task states only (and no status).
    assert set(STATE_ORDER) <= {s.value for s in TaskInstanceState} | {NO_STATUS}


def test_file_words_are_keyed_by_the_vocabularies_only() -> None:
    # A raw string key would let a word go stale when its fact is renamed (issue 35, item 4).
    from enum import StrEnum

    assert all(isinstance(key, StrEnum) for key in FILE_WORDS), [
        k for k in FILE_WORDS if not isinstance(k, StrEnum)]
