"""What a task asks Airflow while it runs: is a run live, is a generation slot free.

The stages take these answers as plain callables (``is_live(run_id)``, ``slot_free()``) and
never import Airflow; the questions are asked here, through the task SDK's API client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from include.generation.claims import LIVE_STATES

log = logging.getLogger(__name__)


def _not_found(exc: Exception) -> bool:
    """Return whether Airflow answered that the run does not exist (HTTP 404)."""
    detail = getattr(getattr(exc, "error", None), "detail", None)
    return isinstance(detail, dict) and detail.get("status_code") == 404


def airflow_run_is_live(dag_id: str) -> Callable[[str], bool]:
    """Return whether a run of ``dag_id`` is still queued or running, asked of Airflow.

    Fails closed: any error but "no such run" counts the run as live.
    """
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def is_live(run_id: str) -> bool:
        try:
            return RuntimeTaskInstance.get_dagrun_state(dag_id, run_id) in LIVE_STATES
        except Exception as exc:  # noqa: BLE001 - unknown is live: never a second writer
            if _not_found(exc):
                log.info("run %s of %s no longer exists; not waiting for it", run_id, dag_id)
                return False
            log.warning("run %s of %s: state unknown (%s); counting it as live", run_id,
                        dag_id, exc)
            return True

    return is_live


def airflow_slot_free(dag_id: str, task_id: str, run_id: str, map_index: int,
                      slots: int) -> Callable[[], bool]:
    """Return whether fewer than ``slots`` shards mapped before this one (lower map index)
    run ``task_id`` in run ``run_id``, asked of Airflow.

    Only shards mapped earlier count, so of the shards waiting the earliest goes first and no
    two wait for each other.
    """
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def earlier(key: str) -> bool:  # keys are "<task_id>_<map_index>"
        name, _, index = key.rpartition("_")
        return name == task_id and index.isdigit() and int(index) < map_index

    def free() -> bool:
        try:
            states = RuntimeTaskInstance.get_task_states(dag_id, task_ids=[task_id],
                                                         run_ids=[run_id])
        except Exception as exc:  # noqa: BLE001 - Airflow's cap on running tasks still holds
            log.info("could not ask Airflow which shards are generating (%s); starting", exc)
            return True
        running = [k for k, state in states.get(run_id, {}).items()
                   if state == "running" and earlier(k)]
        return len(running) < slots

    return free


def max_map_length() -> int:
    """Return how many items Airflow maps one task over here (``core.max_map_length``)."""
    from airflow.sdk.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)
