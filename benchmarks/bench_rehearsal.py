"""The real run rehearsed: the native Celery tier, eight stand-ins, prepare at the run's size,
whole conversations, and a fault schedule, with everything published counted independently.

Starts what ``./dev up`` starts (``scripts/deploy.py``: Postgres, Redis, S3, the api-server,
scheduler, dag-processor, triggerer, two Celery workers, the sshd "GPU host") with eight GPUs,
whose servers are time-compressed stand-ins in SGLang 0.5.23 mode (radix cache, a reasoning
parser, ``enable_thinking``; short outputs so that generation is cheap). Writes synthetic
sources of ``--prompts`` prompts (``synthetic_sources.rehearsal``: a share Infinity-Instruct
chats regenerated with ``turns: all``, the rest WebInstructSub questions), triggers one run
over REST (the real prepare cuts ``--shard-size`` shards: 654,676 prompts in 655 shards is the
planned run) and, while it generates, the fault schedule, each once a share of its shards is
done: a GPU server SIGKILLed and started again on its port, a Celery worker SIGKILLed while it
runs a generate (and started again), the scheduler SIGKILLed and started again, and a backfill
(same ``run_name``, a ``shard_range`` of the run's last shards) triggered beside the run.

Measured, independently of the engine's counters: every prompt shard's ids against the ids of
its published completions (lost, duplicated), every conversation's published turns (indices
repeated or missing), the tokenized rows; the servers' busy share from first to last request
(``standin:busy_seconds_total`` per server, both lives of the restarted one); per shard task
the scheduler, Celery and start-up gaps (medians, ``bench_deployment.gap_parts``); the plan's
XCom size; the monitor's refresh (``RunMonitor`` over the run's S3, time and Python peak
memory); the report task's time; the peak memory of each component (its whole process tree,
tasks included) and of the servers.

    .venv/bin/python -m benchmarks.bench_rehearsal --shards 10 --shard-size 100   # ~10 min
    .venv/bin/python -m benchmarks.bench_rehearsal --prompts 654676 --shard-size 1000   # the run

Prints a table, then one JSON line (see benchmarks/README.md). ``--parts`` measures instead
the parts that run alone at any size (``benchmarks.rehearsal_parts``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_deployment import (
    BUSY,
    FIRST,
    LAST,
    BusySampler,
    gap_parts,
    s3_client,
)
from benchmarks.common import TreeMemory
from include.dag_names import DAG_ID
from scripts import deploy
from scripts.deploy import ROOT, STANDIN_ARGS, WORKERS, Tier, remove_database
from scripts.deploy_api import AirflowApi, unix_time
from scripts.deploy_services import free_port_block
from synthetic_sources.rehearsal import rehearsal_sources
from tests.deployment.conftest import TIME_COMPRESSION
from tests.deployment.runs import GENERATE, object_lines, shard_plan, task_result

SERVERS = 8
#: Short answers, so that generation is cheap (the run's reasoning parser is the default
#: qwen3, the stand-ins' version SGLang 0.5.23 and their radix cache on: their defaults).
REHEARSAL_ARGS = ["--standin-median-output-tokens", "24"]
#: When each fault fires: the share of the run's shards whose generate task has succeeded.
SCHEDULE = (("server_killed", 0.15), ("worker_killed", 0.3), ("scheduler_restarted", 0.45),
            ("backfill", 0.55))


def generated_done(api: AirflowApi, run_id: str) -> tuple[int, list[dict[str, Any]]]:
    tis = api.task_instances(DAG_ID, run_id)
    return sum(t["task_id"] == GENERATE and t["state"] == "success" for t in tis), tis


class FaultSchedule(threading.Thread):
    """Fire ``SCHEDULE`` against one run; ``outcomes`` records what each fault did."""

    def __init__(self, tier: Tier, api: AirflowApi, run_id: str, conf: dict[str, Any],
                 numbers: list[int], t0: float) -> None:
        super().__init__(daemon=True)
        self.tier, self.api, self.run_id, self.conf = tier, api, run_id, conf
        self.numbers, self.shards, self.t0 = sorted(numbers), len(numbers), t0
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.backfill_id: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            for fault, share in SCHEDULE:
                while True:
                    done, tis = generated_done(self.api, self.run_id)
                    if done >= share * self.shards or self.api.run_state(
                            DAG_ID, self.run_id) in ("success", "failed"):
                        break
                    time.sleep(5.0)  # a listing of every task instance: not every second
                at = {"at_s": round(time.monotonic() - self.t0, 1), "shards_done": done}
                self.outcomes[fault] = {**at, **getattr(self, fault)(tis)}
        except Exception as exc:  # noqa: BLE001 - reported in the JSON line, never hidden
            self.error = f"{type(exc).__name__}: {exc}"

    def server_killed(self, tis: list[dict[str, Any]]) -> dict[str, Any]:
        """SIGKILL one GPU server, start it again on its port with its own command line."""
        launched = task_result(self.api, self.run_id, "launch_servers")["servers"]
        victim = sorted(launched, key=lambda s: s["server"]["url"])[0]
        pid = victim["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        env = dict(line.split(b"=", 1) for line in
                   Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in line)
        os.kill(pid, 9)
        time.sleep(3.0)  # dead long enough for the shards' health monitors to eject it
        new = self.tier.procs.start("restarted-server", [a.decode() for a in argv],
                                    env={k.decode(): v.decode() for k, v in env.items()})
        return {"url": victim["server"]["url"], "killed_pid": pid, "restarted_pid": new}

    def worker_killed(self, tis: list[dict[str, Any]]) -> dict[str, Any]:
        """SIGKILL the worker of a running generate; start it again once it is dead."""
        running = [t for t in tis if t["task_id"] == GENERATE and t["state"] == "running"
                   and t["hostname"] in WORKERS]
        if not running:
            return {"skipped": "no generate running on a worker"}
        victim = running[0]
        log_size = self.tier.procs.log(victim["hostname"]).stat().st_size
        self.tier.procs.kill(victim["hostname"])
        self.tier.procs.stop(victim["hostname"], timeout=60)
        self.tier.start_component(victim["hostname"])
        self.tier.wait_worker_ready(victim["hostname"], since=log_size)
        return {"worker": victim["hostname"], "map_index": victim["map_index"],
                "killed_try": victim["try_number"]}

    def scheduler_restarted(self, tis: list[dict[str, Any]]) -> dict[str, Any]:
        stopped = self.tier.restart_component("scheduler")
        return {"stopped_at": stopped, "down_s": round(time.time() - stopped, 1)}

    def backfill(self, tis: list[dict[str, Any]]) -> dict[str, Any]:
        k = max(2, self.shards // 10)
        shard_range = f"{self.numbers[-k]}-{self.numbers[-1]}"
        self.backfill_id = self.api.trigger(DAG_ID, {**self.conf, "shard_range": shard_range})
        return {"shard_range": shard_range, "run_id": self.backfill_id}


def retire_restarted(tier: Tier, api: AirflowApi, run_ids: list[str | None],
                     timeout: float) -> None:
    """Once every generate task of ``run_ids`` has ended, stop the server the bench started
    again: ``stop_servers`` stops only what its run started, and refuses a port that still
    answers after its process is gone ("find what listens on port N")."""
    def generated(run_id: str) -> bool:
        if api.run_state(DAG_ID, run_id) in ("success", "failed"):
            return True
        states = [t["state"] for t in api.task_instances(DAG_ID, run_id)
                  if t["task_id"] == GENERATE]
        return bool(states) and all(s in ("success", "failed", "skipped", "upstream_failed")
                                    for s in states)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(generated(r) for r in run_ids if r):
        time.sleep(2.0)
    tier.procs.stop("restarted-server")


def count_published(s3: Any, run_name: str, plan: list[dict[str, Any]]) -> dict[str, int]:
    """Count every prompt, completion, conversation turn and tokenized row in S3."""
    import io

    import pyarrow.parquet as pq

    from scripts.deploy import BUCKET

    run = f"runs/{run_name}/"
    prompts: list[str] = []
    outputs: list[str] = []
    c = {"turns": 0, "turns_duplicated": 0, "turns_missing": 0, "conversations": 0,
         "tokenized_rows": 0, "completed": 0}
    for entry in plan:
        shard = entry["shard_id"]
        prompts += [r["id"] for r in object_lines(s3, f"{run}prompts/{shard}.jsonl", ".jsonl")]
        where = entry["outputs_uri"].split("/", 3)[3] + "/"
        for rec in object_lines(s3, f"{where}generated/{shard}.jsonl", ".jsonl"):
            outputs.append(rec["id"])
            c["completed"] += rec.get("status") == "completed"
            if rec.get("turns") == "all":
                idx = [t["index"] for t in rec.get("turn_results") or []]
                c["conversations"] += 1
                c["turns"] += len(idx)
                c["turns_duplicated"] += len(idx) - len(set(idx))
                c["turns_missing"] += len(set(range(max(idx, default=-1) + 1)) - set(idx))
        body = s3.get_object(Bucket=BUCKET, Key=f"{where}tokenized/{shard}.parquet")["Body"]
        c["tokenized_rows"] += pq.read_metadata(io.BytesIO(body.read())).num_rows
    ids = set(outputs)
    return {"prompts": len(prompts), "prompt_ids_repeated": len(prompts) - len(set(prompts)),
            "lost": len(set(prompts) - ids),
            "duplicated": len(outputs) - len(ids) + len(ids - set(prompts)), **c}


def busy_share(samples: dict[tuple[str, float], dict[str, float]]) -> dict[str, float]:
    """Return the servers' busy share, first request to last, each URL over all its lives."""
    used = [s for s in samples.values() if s.get(FIRST, 0) > 0]
    if not used:
        return {"busy_share": 0.0, "window_s": 0.0, "servers": 0}
    window = max(s[LAST] for s in used) - min(s[FIRST] for s in used)
    urls = {url for url, _ in samples}
    busy = sum(s[BUSY] for s in samples.values())
    return {"busy_share": busy / (len(urls) * window) if window > 0 else 0.0,
            "window_s": window, "servers": len(urls), "server_lives": len(samples)}


def measured(what: str, call: Any) -> tuple[Any, dict[str, float]]:
    """Return ``call()`` and its seconds and Python peak memory (MiB) as ``<what>_...``."""
    import tracemalloc

    tracemalloc.start()
    t = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return value, {f"{what}_s": round(seconds, 3), f"{what}_peak_mib": round(peak, 2)}


def reporting_costs(tier: Tier, conf: dict[str, Any], plan: list[dict[str, Any]]
                    ) -> dict[str, float]:
    """In this process, over the run's S3, as the worker's environment sees it: one monitor
    refresh (no cache), the whole report again (into its own ``report/<id>/``), the card."""
    import tracemalloc

    env = tier.component_environment(WORKERS[0])
    os.environ.update({k: v for k, v in env.items() if k.startswith(("REGEN_", "AIRFLOW_CONN"))})
    from include.layout import MANIFEST_KEY, REPORT_JSON, report_prefix
    from include.monitor.runs import RunMonitor
    from include.pipeline.binding import bind, open_run_store
    from include.reporting.build import build_report
    from include.reporting.card import render_card
    from include.storage import open_store

    root = open_store(f"s3://{deploy.BUCKET}/runs", s3_conn_id="aws_default")
    states, out = measured("monitor_refresh", RunMonitor(root, ttl_s=0.0).live_runs)
    settings = bind(conf)
    store = open_run_store(settings)
    run_id = f"bench-{time.time_ns()}"
    _, report = measured("report", lambda: build_report(
        settings, store, store, [p["shard_id"] for p in plan], [], run_id=run_id))
    written = json.loads(store.read(report_prefix(run_id) + REPORT_JSON))
    manifest = json.loads(store.read(MANIFEST_KEY))
    _, card = measured("card", lambda: render_card(written, manifest, settings.to_dict()))
    tracemalloc.stop()
    return {**out, "monitor_runs": len(states), **report, **card}


def task_seconds(tis: list[dict[str, Any]], task_id: str) -> list[float]:
    return [unix_time(t["end_date"]) - unix_time(t["start_date"]) for t in tis
            if t["task_id"] == task_id and t["state"] == "success"]


def task_costs(tier: Tier, api: AirflowApi, run_id: str, tis: list[dict[str, Any]],
               max_active: int) -> dict[str, float]:
    """The medians between and inside the shard tasks (``bench_deployment.gap_parts``)."""
    gaps, generating = gap_parts(tier, api, run_id, max_active)
    out = {f"median_{k}_s": round(v, 2) for k, v in gaps.items()}
    out["generating_share"] = round(generating, 4)
    for task in ("shard.generate", "shard.upload", "shard.tokenize", "report"):
        secs = task_seconds(tis, task)
        if secs:
            out[f"median_{task.split('.')[-1]}_task_s"] = round(statistics.median(secs), 2)
    return out


def outcome_checks(faults: FaultSchedule, tis: list[dict[str, Any]]) -> None:
    """Say, per fault, whether the run came through it (from the task instances)."""
    worker = faults.outcomes.get("worker_killed", {})
    if "map_index" in worker:
        final = [t for t in tis if t["task_id"] == GENERATE
                 and t["map_index"] == worker["map_index"]]
        worker["retried_ok"] = bool(final) and final[0]["state"] == "success" and \
            final[0]["try_number"] > worker["killed_try"]
    sched = faults.outcomes.get("scheduler_restarted", {})
    if "stopped_at" in sched:
        sched["tasks_queued_after"] = sum(unix_time(t.get("queued_when")) > sched["stopped_at"]
                                          for t in tis if t.get("queued_when"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shards", type=int, default=10, help="shards of --shard-size prompts")
    size.add_argument("--prompts", type=int, help="prompts in all (654676: the planned run)")
    parser.add_argument("--shard-size", type=int, default=100)
    parser.add_argument("--conversation-share", type=float, default=0.3)
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="the stand-ins' pace (1: the performance model's)")
    parser.add_argument("--max-active-shards", type=int, default=3)
    parser.add_argument("--generate", type=int,
                        help="generate only the first N of the shards prepared (shard_range "
                             "0-(N-1)): the whole prepare and plan, fewer shards to wait for")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the run")
    parser.add_argument("--cache", type=Path, default=ROOT / "var" / "bench-cache")
    parser.add_argument("--keep", type=Path, help="keep the tier's state (logs) here")
    parser.add_argument("--parts", action="store_true",
                        help="measure the parts that run alone instead (rehearsal_parts)")
    args = parser.parse_args(argv)
    prompts = args.prompts or args.shards * args.shard_size
    if args.parts:
        from benchmarks.rehearsal_parts import main as parts_main

        return parts_main(prompts, args.shard_size, args.conversation_share, args.cache)

    def stop(signum: int, frame: Any) -> None:  # a SIGTERM stops the tier too (``finally``)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    t_all = time.monotonic()
    sources = rehearsal_sources(args.cache.resolve(), prompts, args.conversation_share)
    deploy.GPUS = list(range(SERVERS))  # read by Tier.configure and the GPU host's settings
    state = args.keep or Path(tempfile.mkdtemp(prefix="bench-rehearsal-"))
    tier = Tier(state, api_port=free_port_block(),
                extra_data_roots=[str(Path(sources[0]["path"]).parent)])
    # The deployment tier's compressed fault timeouts (a dead worker's tasks retried after
    # 40 s without a heartbeat, not 300 s), as the stand-ins compress the GPUs' time.
    tier.overrides.update({
        **TIME_COMPRESSION,
        "REGEN_MAX_ACTIVE_SHARDS": str(args.max_active_shards),
        "REGEN_EXTRA_SERVER_ARGS": json.dumps(
            [*STANDIN_ARGS, *REHEARSAL_ARGS, "--standin-fault-file", str(tier.fault_file)]),
    })
    log = lambda msg: print(f"[rehearsal] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    out: dict[str, Any] = {"bench": "rehearsal", "prompts_asked": prompts,
                           "shard_size": args.shard_size, "servers": SERVERS,
                           "time_scale": args.time_scale}
    memory = TreeMemory()
    try:
        tier.up(log=log)
        api = tier.api()
        api.wait_for_dag(DAG_ID, timeout=300)
        s3 = s3_client(tier)
        tier.set_faults(time_scale=args.time_scale)
        conf = tier.run_conf(run_name="rehearsal", sources=sources,
                             shard_size=args.shard_size, progress_interval_s=30,
                             enable_thinking=True, max_tokens=256,
                             **({"shard_range": f"0-{args.generate - 1}"} if args.generate
                                else {}))
        for name in tier.procs.names():
            memory.watch(name, tier.procs.pid(name))
        port_base = tier.load()["ports"]["port_base"]
        urls = [f"http://127.0.0.1:{port_base + g}" for g in range(SERVERS)]
        with BusySampler(urls) as sampler, memory:
            t0 = time.monotonic()
            run_id = api.trigger(DAG_ID, conf)
            while api.run_state(DAG_ID, run_id) not in ("success", "failed"):
                if any(t["task_id"] == "launch_servers" and t["state"] == "success"
                       for t in api.task_instances(DAG_ID, run_id)):
                    break
                time.sleep(1.0)
            prepared = task_seconds(api.task_instances(DAG_ID, run_id), "prepare_prompts")
            if not prepared:  # the run ended first: say so (the JSON line still follows)
                out["state"] = api.run_state(DAG_ID, run_id)
                raise SystemExit(f"run {run_id} ended {out['state']} before its servers "
                                 f"launched; its task logs are under {state}/airflow/logs")
            out["prepare_s"] = round(prepared[0], 2)
            plan = shard_plan(api, run_id)
            numbers = [int(p["shard_id"].rsplit("-", 1)[1]) for p in plan]
            faults = FaultSchedule(tier, api, run_id, conf, numbers, t0)
            faults.start()
            for server in task_result(api, run_id, "launch_servers")["servers"]:
                memory.watch("servers", server["pid"])
            faults.join(timeout=args.timeout)
            retire_restarted(tier, api, [run_id, faults.backfill_id], args.timeout)
            state_main = api.wait_for_run(DAG_ID, run_id, args.timeout)
            state_backfill = (api.wait_for_run(DAG_ID, faults.backfill_id, args.timeout)
                              if faults.backfill_id else None)
            out["run_s"] = round(time.monotonic() - t0, 1)
        tis = api.task_instances(DAG_ID, run_id)
        outcome_checks(faults, tis)
        out.update({"state": state_main, "backfill_state": state_backfill,
                    "shards": len(plan), "plan_xcom_bytes": len(json.dumps(plan)),
                    "faults": faults.outcomes, "fault_error": faults.error})
        # Each measurement on its own: one that fails (an import broken mid-edit) is named
        # in the JSON line instead of taking the others with it.
        for name, measure in (
                ("published", lambda: count_published(s3, "rehearsal", plan)),
                ("busy", lambda: {k: round(v, 4) for k, v in busy_share(sampler.latest).items()}),
                ("gaps", lambda: task_costs(tier, api, run_id, tis, args.max_active_shards)),
                ("reporting", lambda: reporting_costs(tier, conf, plan))):
            try:
                out.update(measure())
            except Exception as exc:  # noqa: BLE001 - reported, the others still measured
                out.setdefault("measure_errors", {})[name] = f"{type(exc).__name__}: {exc}"
    finally:
        tier.down(log=log)
        remove_database(tier)
        if args.keep is None:
            shutil.rmtree(state, ignore_errors=True)
        out["peak_rss_mib"] = memory.peaks()
        out["bench_seconds"] = round(time.monotonic() - t_all, 1)
        print(json.dumps(out), file=sys.stderr)  # whatever was measured, even on a failure
    print(f"shards {out.get('shards')} prompts {out.get('prompts')} lost {out.get('lost')} "
          f"duplicated {out.get('duplicated')} turns {out.get('turns')} (repeated "
          f"{out.get('turns_duplicated')}, missing {out.get('turns_missing')}) busy "
          f"{out.get('busy_share')} run {out.get('state')} backfill {out.get('backfill_state')}")
    for fault, what in out.get("faults", {}).items():
        print(f"  {fault}: {what}")
    print(json.dumps(out))
    ok = (out.get("state") == "success" and out.get("lost") == 0
          and out.get("duplicated") == 0 and not out.get("fault_error")
          and not out.get("measure_errors"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
