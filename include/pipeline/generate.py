"""``shard.generate``: one shard's completions into its journal, one writer at a time.

Binds the settings, turns the servers' identifiers (XCom) into the deployment's own URLs
before any request, opens the outputs (at the location rebuilt from the settings and run id,
the plan's ``outputs_uri`` only compared) and prompts stores, and gives the generation stage
Airflow's answers as callables: whether another run that holds the shard is still live, and
(for a shard queued ahead) whether one of the run's generation slots is free.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from include.dag_names import PLAN_TASK
from include.layout import Split
from include.pipeline.airflow_state import airflow_run_is_live, airflow_slot_free
from include.pipeline.binding import bind, fail_without_retry, shard_stores, trusted_outputs_uri


def run(shard_id: str, servers: list[dict[str, Any]], outputs_uri: str,
        wait_for: dict[str, Any] | None, params: Mapping[str, Any] | None, *, dag_id: str,
        run_id: str | None, ti: Any, slots: int, split: str = Split.TRAIN) -> dict[str, Any]:
    """The generate task: generate the shard (resuming its journal); return its summary.

    ``slots`` is how many shards generate at once; ``ti`` (Airflow's task instance) gives the
    shard's map index for the slot check. Without ``ti`` or ``run_id`` the shard waits for
    no slot. ``split`` (the plan's) says whether the shard is the held-out split's.
    """
    from include.durability.journal_settings import JournalSettingsError
    from include.generation import shard
    from include.servers.launch_report import XComMismatchError, trusted_urls

    settings = bind(params)
    with fail_without_retry(XComMismatchError):
        outputs = trusted_outputs_uri(settings, run_id, outputs_uri)
        urls = trusted_urls(servers, settings)
        outputs_store, prompts_store = shard_stores(settings, outputs, split)

    @functools.cache  # the whole plan, read once per task: at most one log line a minute
    def plan_names() -> list[str]:  # the slots' holders by name, in the shard's log
        return [p["shard_id"] for p in ti.xcom_pull(task_ids=PLAN_TASK) or []]

    slot_free = (airflow_slot_free(dag_id, ti.task_id, run_id, ti.map_index, slots, plan_names)
                 if ti and run_id else None)
    # A journal under other completion settings (a run triggered before check_settings
    # looked, or one that raced it) fails for good: a retry would be refused the same way.
    with fail_without_retry(JournalSettingsError):
        return shard.generate_shard(settings, shard_id, urls, outputs_store,
                                    prompts_store, wait_for, run_id=run_id,
                                    is_live=airflow_run_is_live(dag_id), slot_free=slot_free,
                                    lease_ttl_s=settings.deployment.lease_ttl_s)
