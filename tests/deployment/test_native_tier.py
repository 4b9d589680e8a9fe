"""The DAG on the real deployment: Celery workers, scheduler, triggerer, api-server, Postgres,
Redis, S3 and a GPU host over SSH, all started natively (``./dev up``'s tier, one per session).

Each scenario triggers a run through the REST API with a user's token and ends with every
prompt exactly once in the outputs in S3.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from scripts.deploy import DAG_ID, WORKERS, Tier
from scripts.deploy_api import AirflowApi
from tests.deployment.runs import (
    GENERATE,
    assert_every_prompt_exactly_once,
    assert_run_succeeded,
    failure_report,
    object_lines,
    shard_of,
    shard_plan,
    task_log,
    trigger_and_wait,
)

pytestmark = [pytest.mark.deployment, pytest.mark.integration, pytest.mark.timeout(1200)]


def test_a_small_run_succeeds_on_both_workers_with_every_prompt_once(
    tier: Tier, api: AirflowApi, s3: Any
) -> None:
    run_id = trigger_and_wait(tier, api, tier.run_conf(run_name="small", shard_size=40))

    tis = api.task_instances(DAG_ID, run_id)
    ran_on = {ti["hostname"] for ti in tis if ti["state"] == "success"}
    assert ran_on == set(WORKERS), f"tasks ran on {sorted(ran_on)}, not on both {WORKERS}"
    assert sum(ti["task_id"] == GENERATE for ti in tis) >= 3
    assert_every_prompt_exactly_once(s3, "small")
    # TRANSFORMERS_VERBOSITY=error (deploy/airflow.env) reaches every task and the triggerer.
    noisy = [ti["task_id"] for ti in tis if ti["try_number"] and "PyTorch was not found"
             in task_log(tier, run_id, ti).read_text(errors="replace")]
    assert not noisy, f"the PyTorch advisory is in the logs of {noisy}"


def _generate_in_progress(tier: Tier, api: AirflowApi, s3: Any, run_id: str, run_name: str,
                          timeout: float = 300.0) -> dict[str, Any]:
    """Return a running generate task instance whose shard is journaled but not half done."""
    deadline = time.monotonic() + timeout
    plan: list[dict[str, Any]] | None = None
    while time.monotonic() < deadline:
        tis = api.task_instances(DAG_ID, run_id)
        if plan is None and any(t["task_id"] == "prepare_prompts" and t["state"] == "success"
                                for t in tis):
            plan = shard_plan(api, run_id)
        for ti in tis:
            if plan is None or ti["task_id"] != GENERATE or ti["state"] != "running" \
                    or ti["hostname"] not in WORKERS:
                continue
            shard = shard_of(plan, ti)
            done = len(object_lines(s3, f"runs/{run_name}/journal/{shard}/", ".jsonl"))
            total = len(object_lines(s3, f"runs/{run_name}/prompts/{shard}.jsonl", ".jsonl"))
            if 0 < done < total / 2:
                return ti
        if api.run_state(DAG_ID, run_id) in ("success", "failed"):
            break
        time.sleep(0.5)
    pytest.fail(f"no generate task was caught mid-shard:\n{failure_report(tier, api, run_id)}")


def test_a_worker_killed_mid_generate_is_retried_on_the_other_worker(
    tier: Tier, api: AirflowApi, s3: Any
) -> None:
    # One request in flight per server stretches each shard over tens of seconds.
    conf = tier.run_conf(run_name="killed", shard_size=150, concurrency_mode="fixed",
                         in_flight_per_server=1)
    run_id = api.trigger(DAG_ID, conf)
    victim_ti = _generate_in_progress(tier, api, s3, run_id, "killed")
    victim = victim_ti["hostname"]
    survivor = next(w for w in WORKERS if w != victim)
    log_size = tier.procs.log(victim).stat().st_size
    # The whole worker at once (main process, pool, task supervisors, tasks): a node dying.
    assert tier.procs.kill(victim)
    try:
        assert_run_succeeded(tier, api, run_id, timeout=900)
        tries = api.tries(DAG_ID, run_id, GENERATE, victim_ti["map_index"])
        killed = next(t for t in tries if t["try_number"] == victim_ti["try_number"])
        assert killed["hostname"] == victim and killed["state"] == "failed", killed
        final = tries[-1]
        assert final["try_number"] > killed["try_number"]
        assert final["state"] == "success" and final["hostname"] == survivor, final
        result = api.call(
            "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{GENERATE}/xcomEntries/"
            "return_value", params={"map_index": victim_ti["map_index"], "deserialize": True,
                    "stringify": False})
        value = result["value"]
        # Resumed from the journal, and generated the rest itself: the killed try stopped.
        total = sum(value["counts"].values())
        assert 0 < value["resumed"] < total, f"retry resumed {value['resumed']} of {total}"
        assert_every_prompt_exactly_once(s3, "killed")
    finally:
        # Later scenarios get both workers back.
        if tier.procs.pid(victim) is None:
            tier.start_component(victim)
            tier.wait_worker_ready(victim, since=log_size)
