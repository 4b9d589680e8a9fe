"""What a task asks Airflow while it runs: is a run live, is a generation slot free.

The stages take these answers as plain callables (``is_live(run_id)``, ``slot_free()``) and
never import Airflow; the questions are asked here, through the task SDK's API client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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
    from airflow.utils.state import State

    def is_live(run_id: str) -> bool:
        try:
            state = RuntimeTaskInstance.get_dagrun_state(dag_id, run_id)
            return state in State.unfinished_dr_states
        except Exception as exc:  # noqa: BLE001 - unknown is live: never a second writer
            if _not_found(exc):
                log.info("run %s of %s no longer exists; not waiting for it", run_id, dag_id)
                return False
            log.warning("run %s of %s: state unknown (%s); counting it as live", run_id,
                        dag_id, exc)
            return True

    return is_live


class SlotCheck:
    """Whether one of a run's generation slots is free for a shard, asked of Airflow.

    Called, it answers whether fewer than ``slots`` shards mapped before this one (lower map
    index) run ``task_id`` in run ``run_id``; only shards mapped earlier count, so of the
    shards waiting the earliest goes first and no two wait for each other. ``holders()``
    then says who holds the slots, for the shard's log.

    A poll costs the same at 10 shards as at 1,600 (issue 28: it listed every shard's state,
    an ORM row each, twice a second per waiting shard): one count of the shards running
    ``task_id``, and only when that leaves no slot for certain, the states of the shards
    mapped just before this one, one map index each, nearest first, until ``slots`` of them
    run or none is left below. Airflow caps the running ones (``max_active_tis_per_dagrun``)
    and starts the earliest first, so the holders sit just below; after ``scan`` indexes
    without an answer (a retry far back) the poll lists the run once, as before.
    """

    def __init__(self, dag_id: str, task_id: str, run_id: str, map_index: int, slots: int,
                 names: Callable[[], list[str]] | None = None, scan: int = 16) -> None:
        self.dag_id, self.task_id, self.run_id = dag_id, task_id, run_id
        self.map_index, self.slots, self._names = map_index, slots, names
        self.scan = max(scan, slots)
        #: The map indexes of the earlier shards running ``task_id`` at the last answer.
        self.held_by: list[int] = []

    def _earlier(self, key: str) -> int | None:  # keys are "<task_id>_<map_index>"
        name, _, index = key.rpartition("_")
        ok = name == self.task_id and index.isdigit() and int(index) < self.map_index
        return int(index) if ok else None

    def _running(self, sdk: Any, map_index: int | None = None) -> list[int]:
        """Return the earlier map indexes running ``task_id`` (of one index, or all)."""
        states = sdk.get_task_states(self.dag_id, map_index=map_index,
                                     task_ids=[self.task_id], run_ids=[self.run_id])
        return sorted(i for k, state in states.get(self.run_id, {}).items()
                      if state == "running" and (i := self._earlier(k)) is not None)

    def _held_by(self, sdk: Any) -> list[int]:
        running = sdk.get_ti_count(self.dag_id, task_ids=[self.task_id],
                                   run_ids=[self.run_id], states=["running"])
        if running <= self.slots:  # this shard is one of them: the others leave a slot
            return []
        held: list[int] = []
        low = max(0, self.map_index - self.scan)
        for index in range(self.map_index - 1, low - 1, -1):
            held += self._running(sdk, index)
            if len(held) == self.slots:
                return sorted(held)
        return sorted(held) if low == 0 else self._running(sdk)

    def __call__(self) -> bool:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        try:
            self.held_by = self._held_by(RuntimeTaskInstance)
        except Exception as exc:  # noqa: BLE001 - Airflow's cap on running tasks still holds
            log.info("could not ask Airflow which shards are generating (%s); starting", exc)
            return True
        return len(self.held_by) < self.slots

    def holders(self) -> str:
        """Return e.g. "3 of 3 slots held by shard-00000, shard-00001, shard-00002"."""
        try:
            names = self._names() if self._names else []
        except Exception:  # noqa: BLE001 - the plan is only for the words: indexes then
            names = []
        who = [names[i] if i < len(names) else f"map index {i}" for i in self.held_by]
        return (f"{len(self.held_by)} of {self.slots} slot{'s' * (self.slots != 1)} held by "
                f"{', '.join(who) or 'no earlier shard'}")


def airflow_slot_free(dag_id: str, task_id: str, run_id: str, map_index: int,
                      slots: int, names: Callable[[], list[str]] | None = None) -> SlotCheck:
    """Return the ``SlotCheck`` of a shard (``names``: the plan's shard names, by map index)."""
    return SlotCheck(dag_id, task_id, run_id, map_index, slots, names)


def max_map_length() -> int:
    """Return how many items Airflow maps one task over here (``core.max_map_length``)."""
    from airflow.sdk.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)
