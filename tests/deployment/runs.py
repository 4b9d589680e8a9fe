"""What the deployment scenarios read back: outputs in S3, task tries, task logs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from scripts.deploy import BUCKET, DAG_ID, Tier
from scripts.deploy_api import AirflowApi

GENERATE = "shard.generate"


def object_lines(s3: Any, prefix: str, suffix: str) -> list[dict[str, Any]]:
    """Return every JSON line of the objects under ``prefix`` whose key ends in ``suffix``."""
    records = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(suffix):
                body = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
                records += [json.loads(line) for line in body.splitlines() if line.strip()]
    return records


def object_keys(s3: Any, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def prompt_and_output_ids(s3: Any, run_name: str) -> tuple[list[str], list[str]]:
    """Return the ids of the run's prompts and of its completions (duplicates kept)."""
    run = f"runs/{run_name}/"
    prompts = [r["id"] for r in object_lines(s3, run + "prompts/shard-", ".jsonl")]
    outputs = [r["id"] for r in object_lines(s3, run + "generated/shard-", ".jsonl")]
    return prompts, outputs


def assert_every_prompt_exactly_once(s3: Any, run_name: str) -> int:
    """Fail unless each prompt of the run has exactly one completion; return the count."""
    prompts, outputs = prompt_and_output_ids(s3, run_name)
    assert prompts, f"run {run_name} prepared no prompts"
    assert len(set(prompts)) == len(prompts), "a prompt id is in two prompt shards"
    duplicated = sorted({i for i in outputs if outputs.count(i) > 1})
    missing = sorted(set(prompts) - set(outputs))
    assert not duplicated and not missing, (
        f"{len(duplicated)} prompts answered twice (e.g. {duplicated[:3]}), {len(missing)} "
        f"not answered (e.g. {missing[:3]}) of {len(prompts)}")
    assert sorted(outputs) == sorted(prompts)
    return len(prompts)


def shard_plan(api: AirflowApi, run_id: str) -> list[dict[str, Any]]:
    """Return the plan ``prepare_prompts`` returned: one entry per mapped shard, in order."""
    entry = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/prepare_prompts/"
                     "xcomEntries/return_value", params={"deserialize": True, "stringify": False})
    value = entry["value"]
    return json.loads(value) if isinstance(value, str) else value


def task_log(tier: Tier, run_id: str, ti: dict[str, Any]) -> Path:
    """Return the file holding one try's task log (the tier's base log folder)."""
    path = (tier.state / "airflow" / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
            / f"task_id={ti['task_id']}")
    if ti["map_index"] >= 0:
        path /= f"map_index={ti['map_index']}"
    return path / f"attempt={ti['try_number']}.log"


def log_errors(path: Path) -> list[str]:
    """Return the error lines of a task log, exception values included."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return [f"(no log at {path})"]
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("level") in ("error", "critical"):
            details = [f"{d.get('exc_type')}: {d.get('exc_value')}"
                       for d in event.get("error_detail") or []]
            out.append(" | ".join([str(event.get("event"))[:600], *details]))
    return out


def failure_report(tier: Tier, api: AirflowApi, run_id: str) -> str:
    """Describe why a run did not succeed: each failed try's errors, from its own log."""
    parts = []
    for ti in api.task_instances(DAG_ID, run_id):
        if ti["state"] in ("failed", "up_for_retry"):
            name = f"{ti['task_id']}[{ti['map_index']}] try {ti['try_number']} " \
                   f"on {ti['hostname']}"
            parts.append(name + ":\n  " + "\n  ".join(log_errors(task_log(tier, run_id, ti))))
    return "\n".join(parts[:6]) or "no failed task instance"


def assert_run_succeeded(tier: Tier, api: AirflowApi, run_id: str, timeout: float) -> None:
    """Wait for the run; fail, with each failed try's errors, unless it and every one of its
    task instances succeeded (a run can end "success" with failed tasks under a teardown)."""
    state = api.wait_for_run(DAG_ID, run_id, timeout)
    unfinished = [f"{ti['task_id']}[{ti['map_index']}]: {ti['state']}"
                  for ti in api.task_instances(DAG_ID, run_id)
                  if ti["state"] not in ("success", "skipped")]
    assert state == "success" and not unfinished, (
        f"run {run_id} {state}; {unfinished[:8]}:\n{failure_report(tier, api, run_id)}")


def trigger_and_wait(tier: Tier, api: AirflowApi, conf: dict[str, Any],
                     timeout: float = 600.0) -> str:
    """Trigger a run as a user does; return its id once it succeeded (fail with the causes)."""
    run_id = api.trigger(DAG_ID, conf)
    assert_run_succeeded(tier, api, run_id, timeout)
    return run_id


def shard_of(plan: list[dict[str, Any]], ti: dict[str, Any]) -> str:
    """Return the shard a mapped task instance works on (its rendered name, else the plan)."""
    rendered = ti.get("rendered_map_index") or ""
    if re.fullmatch(r"shard-\d+", rendered):
        return rendered
    return plan[ti["map_index"]]["shard_id"]
