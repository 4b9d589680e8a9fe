"""Airflow's side of the monitor page: the DAG's recent runs and their shards' task states.

The page's other half (``include.monitor.runs``) reads the runs' own files; this module
makes sense of what Airflow scheduled. The plugin (``plugins/regen_monitor.py``,
``query_runs``) reads the DAG's newest runs, the mapped ``shard.generate`` / ``shard.upload``
/ ``shard.tokenize`` task instances of each, the plan each run's ``prepare_prompts``
returned and, for a run with a failed task, that task's failure from its log, from Airflow,
and hands them here as plain rows. Everything here is pure and unit-tested.

One vocabulary: a run's and a shard's state on the page ARE Airflow's states (the values of
``DagRunState`` / ``TaskInstanceState``, shown in the words of Airflow's own UI, which the
plugin reads from the installed UI: ``ui_words``); the files' facts that Airflow does not
know (a shard's journal, its outputs) are said in the words of ``FILE_WORDS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from include.dag_names import HELD_OUT_NAME, SHARD_TASKS
from include.layout import REGENERATIONS_PREFIX, Split
from include.outcomes import PromptStatus

#: Runs the page shows: the newest ones (older runs are in Airflow's run list).
RECENT_RUNS = 10
#: A task instance with no state yet (Airflow's UI: "No Status"), as the page keys it.
NO_STATUS = "no_status"
#: Shard states in the order the page lists them: what needs attention first, done last.
#: Airflow's task-instance state values (``TaskInstanceState``) and ``NO_STATUS``.
STATE_ORDER = ("failed", "upstream_failed", "up_for_retry", "restarting", "running",
               "deferred", "up_for_reschedule", "awaiting_input", "queued", "scheduled",
               NO_STATUS, "skipped", "removed", "success")
#: What the page says of a run's files, beside Airflow's states: a table from the monitor's
#: own facts (``include.monitor.runs``: a shard's files, a prompt's journal outcome, a
#: report's gates, a server's probe) to the words shown. Nothing here names a task or run
#: state: those are Airflow's.
class ShardPhase(StrEnum):
    """Where a shard is by its files (what the monitor reads), beside Airflow's task state."""

    JOURNAL_WRITING = "journal_writing"
    NO_JOURNAL = "no_journal"
    GENERATED = "generated"
    TOKENIZED = "tokenized"


class FileFact(StrEnum):
    """The monitor's other facts from files, which no stage's vocabulary names."""

    TRUNCATED = "truncated"  # completed answers the server cut at max_tokens
    ROWS_WRITTEN = "written"  # rows after the tokenize task's quality filters and checks
    QUARANTINED = "quarantined"
    DROPPED = "dropped"
    GATES_PASSED = "gates_passed"  # a report's quality gates
    GATES_FAILED = "gates_failed"
    HEALTHY = "healthy"  # a server the journals name, as probed
    NOT_OURS = "not_ours"
    NOT_PROBED = "not_probed"
    DOWN = "down"


FILE_WORDS: dict[StrEnum, str] = {
    # a shard, by its files
    ShardPhase.JOURNAL_WRITING: "journal being written",
    ShardPhase.NO_JOURNAL: "no journal yet",
    ShardPhase.GENERATED: "generated, not tokenized",
    ShardPhase.TOKENIZED: "tokenized",
    # a prompt's outcome in the journal
    PromptStatus.COMPLETED: "completed",
    FileFact.TRUNCATED: "of them truncated",
    PromptStatus.SKIPPED: "skipped",
    PromptStatus.FAILED: "failed",
    FileFact.ROWS_WRITTEN: "rows written",
    FileFact.QUARANTINED: "quarantined",
    FileFact.DROPPED: "dropped",
    FileFact.GATES_PASSED: "gates passed",
    FileFact.GATES_FAILED: "gates failed",
    FileFact.HEALTHY: "healthy",
    FileFact.NOT_OURS: "not probed (not a server of this deployment)",
    FileFact.NOT_PROBED: "not probed (no shard generating)",
    FileFact.DOWN: "down",
}


def ui_words(states: Iterable[str], translations: Mapping[str, str] | None = None
             ) -> dict[str, str]:
    """Return the word Airflow's UI shows for each state value (and ``NO_STATUS``), from its
    own ``translations`` (``common.json``'s ``states``), else spelt as the UI would."""
    table = dict(translations or {})
    return {s: table.get(s) or s.replace("_", " ").title() for s in [*states, NO_STATUS]}


def classify_shard(states: Mapping[str, str | None]) -> tuple[str, str] | None:
    """Return ``(Airflow state, task id)`` of a shard from its tasks' states, or None.

    ``states`` maps the ``SHARD_TASKS`` to their task instances' states (a missing task or
    None: not scheduled yet, ``NO_STATUS``). The task named is the shard's first unfinished
    one (the generate task for a done shard: its log holds the shard's results). None for a
    map index Airflow removed (the plan got shorter when the run was cleared).
    """
    if states.get(SHARD_TASKS[0]) == "removed":
        return None
    for task_id in SHARD_TASKS:
        state = states.get(task_id)
        if state != "success":
            return state or NO_STATUS, task_id
    return "success", SHARD_TASKS[0]


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
                  ui_base: str = "", default_run_name: str = "local",
                  failure: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return one run for the page: state, failure, link, and its shards by Airflow state.

    ``run`` holds ``run_id``, ``state``, ``live`` (whether Airflow counts that state as
    unfinished: the plugin asks Airflow, so the page has no copy of the list), ``conf``,
    ``start_date`` (ISO text or None) and ``note`` (the run's note in Airflow, or None);
    ``plan`` is the ``prepare_prompts`` return value (None before it finished); ``failure``
    the run's first failed task (``{"task_id", "map_index", "message", "lines"}``), if any.
    Each state lists ``{"shard_id", "map_index", "task", "state", "url"}`` in map-index
    order; ``shard_counts`` counts them, in ``STATE_ORDER``.
    """
    run_id = str(run["run_id"])
    conf = run.get("conf") or {}
    by_index: dict[int, dict[str, str | None]] = {}
    names: dict[int, str] = {}
    for t in tasks:
        by_index.setdefault(t.map_index, {})[t.task_id] = t.state
        if t.rendered_map_index and t.rendered_map_index != str(t.map_index):
            names.setdefault(t.map_index, t.rendered_map_index)

    def shard_name(index: int) -> str:
        name = names.get(index)
        if name is None and isinstance(plan, list) and 0 <= index < len(plan):
            entry = plan[index] or {}
            name = (HELD_OUT_NAME if entry.get("split") == Split.HELD_OUT
                    else entry.get("shard_id"))
        return name or f"#{index}"

    shards: dict[str, list[dict[str, Any]]] = {}
    for index in sorted(by_index):
        found = classify_shard(by_index[index])
        if found is None:
            continue
        state, task_id = found
        shards.setdefault(state, []).append({
            "shard_id": shard_name(index), "map_index": index, "task": task_id,
            "state": state, "url": ui_base + task_log_path(dag_id, run_id, task_id, index)})
    order = [s for s in STATE_ORDER if s in shards] + sorted(set(shards) - set(STATE_ORDER))
    shards = {s: shards[s] for s in order}
    out_failure = None
    if failure:
        index = int(failure.get("map_index", -1))
        task_id = str(failure["task_id"])
        out_failure = {
            "task_id": task_id, "map_index": index,
            "shard_id": shard_name(index) if index >= 0 else None,
            "message": failure.get("message") or "", "lines": list(failure.get("lines") or ()),
            "url": ui_base + (task_log_path(dag_id, run_id, task_id, index) if index >= 0
                              else f"{run_path(dag_id, run_id)}/tasks/{quote(task_id, safe='')}")}
    return {
        "run_id": run_id, "state": run.get("state"), "live": bool(run.get("live")),
        "run_name": conf.get("run_name") or default_run_name, "location": _location(plan),
        "note": run.get("note") or None,
        "start_date": run.get("start_date"), "url": ui_base + run_path(dag_id, run_id),
        "failure": out_failure, "shards": shards,
        "shard_counts": {c: len(v) for c, v in shards.items()},
    }


def first_failure(events: Iterable[Mapping[str, Any]], max_lines: int = 12
                  ) -> tuple[str, list[str]]:
    """Return a failed attempt's reason from its log: the exception, and our error lines.

    ``events`` are the attempt's log events as Airflow serves them (``event``, ``level``,
    ``logger``, ``error_detail``, ``exit_code``). The reason is a refusal's (Airflow's ``Task
    exited`` line, its code the reason) or the exception the task failed with (``type:
    message``); the lines are the last ``max_lines`` ERROR events this project's code logged
    before it (``include.*``: e.g. check_settings' refusals).
    """
    message, lines = "", []
    for e in events:
        detail = e.get("error_detail")
        if e.get("event") == "Task exited" and isinstance(e.get("exit_code"), str):
            # A refusal (include/pipeline/refusal.py): a SystemExit, its code the reason.
            message = message or e["exit_code"]
        elif detail and isinstance(detail, list) and isinstance(detail[0], Mapping):
            exc = detail[0]
            kind = str(exc.get("exc_type") or "Error")
            # A deliberate failure (no retry) says what it is; any other shows its type.
            message = str(exc.get("exc_value") or "") if kind == "AirflowFailException" else (
                f"{kind}: {exc.get('exc_value', '')}")
        elif (str(e.get("level", "")).lower() == "error"
              and str(e.get("logger", "")).startswith("include.") and not message):
            lines.append(str(e.get("event", "")))
    return message, lines[-max_lines:]


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


def _started(entry: Mapping[str, Any]) -> str:
    return str(entry.get("start_date") or "")


def page_order(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the page's sections, those with a live Airflow run first, then newest first.

    A section is a run's outputs location (its ``airflow_runs``, newest first) or an
    Airflow run with no outputs yet (``{"airflow_runs": [run]}``); one without any Airflow
    run of the recent ones goes last, by name.
    """
    def key(section: dict[str, Any]) -> tuple[int, str]:
        runs = section.get("airflow_runs") or []
        live = any(r.get("live") for r in runs)
        newest = max((_started(r) for r in runs), default="")
        return (0 if live else 1 if runs else 2), newest

    ranked = sorted(sections, key=lambda s: str(s.get("run_name", "")))
    ranked.sort(key=lambda s: key(s)[1], reverse=True)  # stable: newest first
    ranked.sort(key=lambda s: key(s)[0])
    return ranked
