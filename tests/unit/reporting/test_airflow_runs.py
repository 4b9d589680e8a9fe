"""Airflow's side of the monitor: shard classes from task states, UI links, page sections."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from include.reporting.airflow_runs import (
    SHARD_TASKS,
    TaskRow,
    attach,
    classify_shard,
    run_path,
    summarize_run,
    task_log_path,
)

DAG = "regenerate_drafter_data"
RUN = "manual__2026-05-01T10:00:00.123+00:00"
GEN, UP, TOK = SHARD_TASKS


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({GEN: "success", UP: "success", TOK: "success"}, ("done", GEN, "success")),
        ({GEN: "running", UP: None, TOK: None}, ("running", GEN, "running")),
        ({GEN: "success", UP: "success", TOK: "running"}, ("running", TOK, "running")),
        ({GEN: "queued"}, ("queued", GEN, "queued")),
        ({GEN: "scheduled"}, ("queued", GEN, "scheduled")),
        ({GEN: "deferred"}, ("queued", GEN, "deferred")),
        ({GEN: "up_for_retry"}, ("queued", GEN, "up_for_retry")),
        ({}, ("queued", GEN, None)),  # expanded, not scheduled yet
        # Generated, waiting for upload to be scheduled: still queued, not running.
        ({GEN: "success", UP: None, TOK: None}, ("queued", UP, None)),
        ({GEN: "failed", UP: "upstream_failed", TOK: "upstream_failed"},
         ("failed", GEN, "failed")),
        ({GEN: "success", UP: "upstream_failed"}, ("failed", UP, "upstream_failed")),
        # A run marked failed by hand skips what had not started.
        ({GEN: "success", UP: "skipped", TOK: "skipped"}, ("failed", UP, "skipped")),
        ({GEN: "removed", UP: "removed", TOK: "removed"}, None),
    ],
)
def test_a_shard_is_classed_by_its_first_unfinished_task(states, expected) -> None:
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


def test_a_run_lists_its_shards_by_class_with_names_and_log_links() -> None:
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
    out = summarize_run(DAG, run, _rows(spec, named={0, 1, 2}), plan, ui_base="/airflow")
    assert (out["run_name"], out["location"], out["state"]) == ("exp1", ".", "running")
    assert out["url"] == "/airflow" + run_path(DAG, RUN)
    assert out["shard_counts"] == {"running": 1, "queued": 2, "failed": 1, "done": 1}
    # The grid's name when the task started; the plan's shard for one not started; the map
    # index when neither is known (the plan lists fewer shards than were mapped).
    assert [s["shard_id"] for s in out["shards"]["queued"]] == ["shard-00013", "#5"]
    running = out["shards"]["running"][0]
    assert running == {"shard_id": "shard-00001", "map_index": 1, "task": GEN,
                       "state": "running",
                       "url": "/airflow" + task_log_path(DAG, RUN, GEN, 1)}
    assert out["shards"]["failed"][0]["shard_id"] == "shard-00002"
    assert out["shards"]["done"][0]["url"].endswith("/tasks/shard.generate/mapped/0")


def test_a_run_before_its_plan_uses_the_default_run_name_and_the_run_folder() -> None:
    run = {"run_id": "r1", "state": "queued", "conf": {}, "start_date": None}
    out = summarize_run(DAG, run, [], None, default_run_name="local")
    assert (out["run_name"], out["location"]) == ("local", ".")
    assert out["shard_counts"] == {"running": 0, "queued": 0, "failed": 0, "done": 0}
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
