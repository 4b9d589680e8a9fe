"""What the deployment scenarios read back: outputs in S3, task tries, task logs, servers."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from include.dag_names import DAG_ID, GENERATE_TASK
from scripts.deploy import BUCKET, Tier
from scripts.deploy_api import AirflowApi

GENERATE = GENERATE_TASK


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


def task_result(api: AirflowApi, run_id: str, task_id: str, map_index: int = -1) -> Any:
    """Return what a task instance returned (its ``return_value`` XCom)."""
    params: dict[str, Any] = {"deserialize": True, "stringify": False}
    if map_index >= 0:
        params["map_index"] = map_index
    entry = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/"
                     "xcomEntries/return_value", params=params)
    value = entry["value"]
    return json.loads(value) if isinstance(value, str) else value


def shard_plan(api: AirflowApi, run_id: str) -> list[dict[str, Any]]:
    """Return the plan ``prepare_prompts`` returned: one entry per mapped shard, in order."""
    return task_result(api, run_id, "prepare_prompts")


def wait_for_tasks(tier: Tier, api: AirflowApi, run_id: str,
                   found: Callable[[list[dict[str, Any]]], Any], what: str,
                   timeout: float = 300.0) -> Any:
    """Poll the run's task instances until ``found(tis)`` is truthy; return its value.

    Fails, with each failed try's errors, when the run ends first or ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tis = api.task_instances(DAG_ID, run_id)
        if value := found(tis):
            return value
        if api.run_state(DAG_ID, run_id) in ("success", "failed"):
            break
        time.sleep(0.5)
    pytest.fail(f"run {run_id}: never {what}:\n{failure_report(tier, api, run_id)}")


def log_events(path: Path) -> list[str]:
    """Return every event of a task log (what the task printed and logged), in order."""
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(str(json.loads(line).get("event")))
        except ValueError:
            continue
    return events


def writer_spans(s3: Any, journal_prefix: str) -> dict[str, tuple[int, int]]:
    """Return, per journal writer (one generate try), the first and last time it wrote a
    segment (ns, from the segment names ``part-<time_ns>-<writer>-<seq>.jsonl``)."""
    spans: dict[str, tuple[int, int]] = {}
    for key in object_keys(s3, journal_prefix):
        match = re.search(r"/part-(\d+)-([0-9a-f]+)-\d+\.jsonl$", key)
        if match:
            at, writer = int(match[1]), match[2]
            first, last = spans.get(writer, (at, at))
            spans[writer] = (min(first, at), max(last, at))
    return spans


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


def shard_of(plan: list[dict[str, Any]], ti: dict[str, Any]) -> str:
    """Return the shard a mapped task instance works on (its rendered name, else the plan)."""
    rendered = ti.get("rendered_map_index") or ""
    if re.fullmatch(r"shard-\d+", rendered):
        return rendered
    return plan[ti["map_index"]]["shard_id"]


class ServerWatch(threading.Thread):
    """Record, every ``interval`` s, whether each server's process lives and its port answers.

    ``down_since[url]`` is when a server that had been seen up was first seen down.
    """

    def __init__(self, servers: dict[str, int], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.servers = servers  # url -> pid
        self.interval = interval
        self.seen_up: set[str] = set()
        self.down_since: dict[str, float] = {}
        self._stop_event = threading.Event()

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # a status is an answer
        except OSError:
            return False

    def sample(self) -> None:
        for url, pid in self.servers.items():
            if os.path.exists(f"/proc/{pid}") and self._answers(url):
                self.seen_up.add(url)
            elif url in self.seen_up and url not in self.down_since:
                self.down_since[url] = time.time()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def __enter__(self) -> ServerWatch:
        self.sample()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()
        self.sample()  # the state at the end, whatever the last interval missed


def journal_records(s3: Any, journal_prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """Return every record in a shard's journal segments (final records and conversation
    turns alike), each with the writer (one generate try) whose segment holds it."""
    out = []
    for key in object_keys(s3, journal_prefix):
        match = re.search(r"/part-\d+-([0-9a-f]+)-\d+\.jsonl$", key)
        if not match:
            continue
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        out += [(match[1], json.loads(line)) for line in body.splitlines() if line.strip()]
    return out


def conversation_shards(s3: Any, run_name: str) -> dict[str, dict[str, Any]]:
    """Return, per shard holding whole conversations, its generated conversation records
    (``records``), its journal's records with their writers (``journal``), its
    tokenized row ids (``rows``) and its tokenized manifest (``manifest``)."""
    import io

    import pyarrow.parquet as pq

    run = f"runs/{run_name}/"
    out = {}
    for key in sorted(object_keys(s3, run + "generated/shard-")):
        match = re.search(r"(shard-\d+)\.jsonl$", key)
        if not match:
            continue
        shard = match[1]
        records = [r for r in object_lines(s3, key, ".jsonl") if r.get("turns") == "all"]
        if not records:
            continue
        parquet = s3.get_object(Bucket=BUCKET, Key=f"{run}tokenized/{shard}.parquet")
        table = pq.read_table(io.BytesIO(parquet["Body"].read()), columns=["id"])
        manifest = s3.get_object(Bucket=BUCKET, Key=f"{run}tokenized/{shard}.manifest.json")
        out[shard] = {"records": records, "journal": journal_records(s3, f"{run}journal/{shard}/"),
                      "rows": table["id"].to_pylist(),
                      "manifest": json.loads(manifest["Body"].read())}
    return out
