"""Airflow's side of the monitor page: the DAG's recent runs and their shards' task states.

The page's other half (``include.reporting.monitor``) reads the runs' own files; this module
makes sense of what Airflow scheduled. The plugin (``plugins/regen_monitor.py``,
``query_runs``) reads the DAG's newest runs, the mapped ``shard.generate`` / ``shard.upload``
/ ``shard.tokenize`` task instances of each and the plan each run's ``prepare_prompts``
returned, from Airflow's metadata database, and hands them here as plain rows. Everything
here is pure and unit-tested:

* ``classify_shard``: a shard is *done* when its three tasks succeeded, else it is in its
  first unfinished task, *running* (running), *failed* (failed, upstream_failed, or skipped
  because the run was stopped) or *queued* (scheduled, queued, deferred, waiting for a retry,
  or not scheduled yet because the task before it is still to finish).
* ``summarize_run``: one run's state, shards by class with their names (the grid's name, or
  the plan's shard id for a task that has not started) and the UI's links to the run and to
  each shard's task log.
* ``attach``: which section of the page (run folder and outputs location) each run writes to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from include.layout import REGENERATIONS_PREFIX

#: The mapped task group's tasks, in the order each shard runs them.
SHARD_TASKS = ("shard.generate", "shard.upload", "shard.tokenize")
#: The task whose return value is the run's plan: one ``{"shard_id", "outputs_uri", ...}``
#: per map index of the shard tasks.
PLAN_TASK = "prepare_prompts"
#: Shard classes in the order the page shows them.
SHARD_CLASSES = ("running", "queued", "failed", "done")
#: Runs the page shows: the newest ones (older runs are in Airflow's run list).
RECENT_RUNS = 10
_FAILED = {"failed", "upstream_failed", "skipped"}


def classify_shard(states: Mapping[str, str | None]) -> tuple[str, str, str | None] | None:
    """Return ``(class, task id, state)`` of a shard from its tasks' states, or None.

    ``states`` maps the ``SHARD_TASKS`` to their task instances' states (a missing task or
    None: not scheduled yet). The task named is the shard's first unfinished one (the
    generate task for a done shard: its log holds the shard's results). None for a map index
    Airflow removed (the plan got shorter when the run was cleared).
    """
    if states.get(SHARD_TASKS[0]) == "removed":
        return None
    for task_id in SHARD_TASKS:
        state = states.get(task_id)
        if state == "success":
            continue
        if state in _FAILED:
            return "failed", task_id, state
        if state == "running":
            return "running", task_id, state
        return "queued", task_id, state
    return "done", SHARD_TASKS[0], "success"


def run_path(dag_id: str, run_id: str) -> str:
    """Return the Airflow UI's path of a DAG run (its grid, details and graph)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def task_log_path(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    """Return the Airflow UI's path of a mapped task instance (it opens on its log)."""
    return f"{run_path(dag_id, run_id)}/tasks/{quote(task_id, safe='')}/mapped/{map_index}"


@dataclass(frozen=True)
class TaskRow:
    """One shard task instance as read from Airflow (``rendered_map_index`` as the grid
    shows it: the shard's name once the task started, else the map index)."""

    task_id: str
    map_index: int
    state: str | None
    rendered_map_index: str | None


def _location(plan: Any) -> str:
    """Return the outputs location the plan writes to: ``.`` or ``regenerations/<id>``."""
    if isinstance(plan, list) and plan and isinstance(plan[0], dict):
        head, sep, tail = str(plan[0].get("outputs_uri", "")).rpartition(
            f"/{REGENERATIONS_PREFIX}/")
        if sep and head:
            return f"{REGENERATIONS_PREFIX}/{tail}"
    return "."


def summarize_run(dag_id: str, run: Mapping[str, Any], tasks: Iterable[TaskRow], plan: Any,
                  ui_base: str = "", default_run_name: str = "local") -> dict[str, Any]:
    """Return one run for the page: state, link, and its shards by class.

    ``run`` holds ``run_id``, ``state``, ``conf`` and ``start_date`` (ISO text or None);
    ``plan`` is the ``prepare_prompts`` return value (None before it finished). Each class
    lists ``{"shard_id", "map_index", "task", "state", "url"}`` in map-index order.
    """
    run_id = str(run["run_id"])
    conf = run.get("conf") or {}
    by_index: dict[int, dict[str, str | None]] = {}
    names: dict[int, str] = {}
    for t in tasks:
        by_index.setdefault(t.map_index, {})[t.task_id] = t.state
        if t.rendered_map_index and t.rendered_map_index != str(t.map_index):
            names.setdefault(t.map_index, t.rendered_map_index)
    shards: dict[str, list[dict[str, Any]]] = {c: [] for c in SHARD_CLASSES}
    for index in sorted(by_index):
        found = classify_shard(by_index[index])
        if found is None:
            continue
        kind, task_id, state = found
        name = names.get(index)
        if name is None and isinstance(plan, list) and index < len(plan):
            name = (plan[index] or {}).get("shard_id")
        shards[kind].append({
            "shard_id": name or f"#{index}", "map_index": index, "task": task_id,
            "state": state, "url": ui_base + task_log_path(dag_id, run_id, task_id, index)})
    return {
        "run_id": run_id, "state": run.get("state"),
        "run_name": conf.get("run_name") or default_run_name, "location": _location(plan),
        "start_date": run.get("start_date"), "url": ui_base + run_path(dag_id, run_id),
        "shards": shards, "shard_counts": {c: len(v) for c, v in shards.items()},
    }


def attach(runs: list[dict[str, Any]], airflow_runs: list[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (the page's runs, each location with its ``airflow_runs``; the Airflow runs
    no location of the page matches, e.g. one not past ``prepare_prompts`` yet).

    A run folder is the run's ``run_name``; a location is ``.`` or the forced regeneration's
    folder. The page's run states are shared cache entries: they are copied, not changed.
    """
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ar in airflow_runs:
        by_key.setdefault((ar["run_name"], ar["location"]), []).append(ar)
    out = []
    matched: set[int] = set()
    for run in runs:
        locations = []
        for loc in run["locations"]:
            mine = by_key.get((run["run_name"], loc["location"]), [])
            matched.update(id(a) for a in mine)
            locations.append({**loc, "airflow_runs": mine})
        out.append({**run, "locations": locations})
    return out, [a for a in airflow_runs if id(a) not in matched]
