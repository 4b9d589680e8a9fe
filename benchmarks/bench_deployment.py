"""How busy the servers stay when Airflow runs the shards: the native deployment, end to end.

Starts the deployment tier (``scripts/deploy.py``, what ``./dev up`` starts: scheduler,
dag-processor, triggerer, api-server, two Celery workers, Postgres, Redis, S3, the sshd GPU
host with three stand-in servers), triggers one run of at least 50 shards through the REST API
(a synthetic WebInstructSub file of shards x shard-size prompts, written once under
``var/bench-cache/`` and added to the tier's data roots) and measures, from the servers' own
counters (``sglang_standin.switchboard``: wall seconds with a request queued or running, first
and last busy moment), the fraction of server time busy from the first request to the last.
Whatever the scheduler, Celery and task start-up leave between mapped tasks counts as idle.
Then the baseline: the tier's dag-processor and workers restarted with
``REGEN_MAX_ACTIVE_SHARDS=1`` and some of the same shards generated again
(``force_regenerate``), one shard at a time, so each shard's tail and each hand-over
between tasks leave the servers idle.

    .venv/bin/python -m benchmarks.bench_deployment [--shards 51] [--shard-size 100]
        [--time-scale 0.4] [--max-running-requests 32] [--baseline-shards 3]

Prints a table, then one JSON line (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from include.dag_names import DAG_ID
from scripts.deploy import GPUS, ROOT, STANDIN_ARGS, WORKERS, Tier, remove_database
from scripts.deploy_api import AirflowApi, unix_time
from scripts.deploy_services import free_port_block
from tests.deployment.runs import GENERATE, object_lines, shard_plan, task_log

#: The counters of sglang_standin.switchboard this benchmark reads.
BUSY, FIRST, LAST, STARTED = ("standin:busy_seconds_total", "standin:first_busy_timestamp_seconds",
                              "standin:last_busy_timestamp_seconds", "process_start_time_seconds")


def read_metrics(url: str) -> dict[str, float]:
    """Return every sample of a server's ``/metrics`` by name (labels dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


class BusySampler(threading.Thread):
    """Keep the latest counters of every server process seen (a run's servers end with it)."""

    def __init__(self, urls: list[str], interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.urls, self.interval = urls, interval
        self.latest: dict[tuple[str, float], dict[str, float]] = {}  # (url, started) -> sample
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            for url in self.urls:
                try:
                    sample = read_metrics(url)
                except OSError:
                    continue  # not started yet, or stopped by the run's teardown
                if STARTED in sample:
                    self.latest[(url, sample[STARTED])] = sample
            self._stop_event.wait(self.interval)

    def __enter__(self) -> BusySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()


@dataclass
class RunMeasure:
    """What one run did and how busy it kept the servers."""

    label: str
    max_active_shards: int
    shards: int = 0
    prompts: int = 0
    run_s: float = 0.0
    window_s: float = 0.0
    busy_fraction: float = 0.0
    idle_per_server_s: float = 0.0
    lost: int = 0
    duplicated: int = 0
    servers: int = 0
    #: Medians over the generate tasks (s): a freed slot to the next shard queued, queued to
    #: started on a worker, started to its first request.
    gaps: dict[str, float] = field(default_factory=dict)
    #: Share of the first request to the last in which some shard was generating (task logs).
    generating_fraction: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"max_active_shards": self.max_active_shards, "shards": self.shards,
                "prompts": self.prompts, "busy_fraction": round(self.busy_fraction, 4),
                "idle_between_tasks_s": round(self.idle_per_server_s, 2),
                "window_s": round(self.window_s, 2), "seconds": round(self.run_s, 1),
                "lost": self.lost, "duplicated": self.duplicated,
                "generating_fraction": round(self.generating_fraction, 4),
                **{f"median_{k}_s": round(v, 2) for k, v in self.gaps.items()}}


def busy_from(samples: list[dict[str, float]]) -> tuple[float, float, int]:
    """Return (window s, busy fraction, servers) over the servers' last counters."""
    used = [s for s in samples if s.get(FIRST, 0) > 0]
    if not used:
        return 0.0, 0.0, 0
    window = max(s[LAST] for s in used) - min(s[FIRST] for s in used)
    busy = sum(s[BUSY] for s in samples)
    servers = len(samples)
    return window, (busy / (servers * window) if window > 0 else 0.0), servers


def count_outputs(s3: Any, run_name: str, plan: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Return (prompts, lost, duplicated) over the planned shards' outputs."""
    prompts: list[str] = []
    outputs: list[str] = []
    for entry in plan:
        shard = entry["shard_id"]
        prompts += [r["id"] for r in object_lines(s3, f"runs/{run_name}/prompts/{shard}.jsonl",
                                                   ".jsonl")]
        where = entry["outputs_uri"].split("/", 3)[3]  # s3://bucket/<key prefix>
        outputs += [r["id"] for r in object_lines(s3, f"{where}/generated/{shard}.jsonl",
                                                   ".jsonl")]
    lost = len(set(prompts) - set(outputs))
    duplicated = len(outputs) - len(set(outputs)) + len(set(outputs) - set(prompts))
    return len(prompts), lost, duplicated


def generating_span(path: Path) -> tuple[float, float] | None:
    """Return when a generate task sent its first request and when its last one ended (its
    "N prompts -> servers" and "done:" lines); None for a shard with nothing to send."""
    first = last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        text = str(event.get("event"))
        if " prompts -> " in text:
            first = unix_time(event.get("timestamp"))
        elif " done: " in text:
            last = unix_time(event.get("timestamp"))
    return (first, last) if first and last else None


def covered(spans: list[tuple[float, float]]) -> float:
    """Return the fraction of first start to last end that some span covers."""
    if not spans:
        return 0.0
    spans = sorted(spans)
    total, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            total, lo, hi = total + hi - lo, a, b
        else:
            hi = max(hi, b)
    total += hi - lo
    whole = max(b for _, b in spans) - spans[0][0]
    return total / whole if whole > 0 else 0.0


def gap_parts(tier: Tier, api: AirflowApi, run_id: str,
              max_active: int) -> tuple[dict[str, float], float]:
    """Split the time between mapped tasks into parts (medians); also return the share of the
    run's generating time some shard generated.

    ``scheduler``: the last generate task to end before a task was queued, to that task
    queued (the first tasks, queued before any ended, are left out); ``celery``: queued to
    started on a worker; ``task_setup``: started to its first request (a shard queued ahead
    waits there for a slot); ``handover``: the k-th shard's first request after the
    (k - ``max_active``)-th shard's last one ended, the time a slot sat without a shard.
    """
    tis = [ti for ti in api.task_instances(DAG_ID, run_id)
           if ti["task_id"] == GENERATE and ti["state"] == "success"]
    ends = sorted(unix_time(ti["end_date"]) for ti in tis)
    parts: dict[str, list[float]] = {"scheduler": [], "celery": [], "task_setup": [],
                                     "handover": []}
    spans = []
    for ti in tis:
        queued, started = unix_time(ti["queued_when"]), unix_time(ti["start_date"])
        ended_before = [end for end in ends if end <= queued]
        if ended_before:
            parts["scheduler"].append(queued - ended_before[-1])
        parts["celery"].append(started - queued)
        span = generating_span(task_log(tier, run_id, ti))
        if span is not None:
            parts["task_setup"].append(span[0] - started)
            spans.append(span)
    firsts, lasts = sorted(a for a, _ in spans), sorted(b for _, b in spans)
    parts["handover"] = [firsts[k] - lasts[k - max_active]
                         for k in range(max_active, len(firsts))]
    return {k: statistics.median(v) for k, v in parts.items() if v}, covered(spans)


def measure(tier: Tier, api: AirflowApi, s3: Any, conf: dict[str, Any], label: str,
            max_active: int, timeout: float) -> RunMeasure:
    """Trigger one run, wait for it, and measure its servers' busy time and its outputs."""
    urls = [f"http://127.0.0.1:{tier.load()['ports']['port_base'] + g}" for g in GPUS]
    result = RunMeasure(label, max_active)
    with BusySampler(urls) as sampler:
        t0 = time.monotonic()
        run_id = api.trigger(DAG_ID, conf)
        state = api.wait_for_run(DAG_ID, run_id, timeout)
        result.run_s = time.monotonic() - t0
    if state != "success":
        result.notes.append(f"run {run_id} ended {state}")
    plan = shard_plan(api, run_id)
    result.shards = len(plan)
    result.window_s, result.busy_fraction, result.servers = busy_from(list(sampler.latest.values()))
    result.idle_per_server_s = result.window_s * (1 - result.busy_fraction)
    result.prompts, result.lost, result.duplicated = count_outputs(s3, conf["run_name"], plan)
    result.gaps, result.generating_fraction = gap_parts(tier, api, run_id, max_active)
    return result


def restart_for(tier: Tier, api: AirflowApi, max_active: int) -> float:
    """Restart the dag-processor and workers with ``REGEN_MAX_ACTIVE_SHARDS=max_active`` (read
    when the DAG file is parsed); return once the scheduler has the new DAG version."""
    t0 = time.monotonic()
    path = f"/dags/{DAG_ID}/dagVersions"
    before = api.call("GET", path)["total_entries"]
    tier.overrides["REGEN_MAX_ACTIVE_SHARDS"] = str(max_active)
    for name in ("dag-processor", *WORKERS):
        tier.restart_component(name, kill=False)
    deadline = time.monotonic() + 180
    while api.call("GET", path)["total_entries"] <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("the dag-processor stored no new DAG version in 180 s")
        time.sleep(1.0)
    return time.monotonic() - t0


def bench_source(cache: Path, prompts: int, seed: int = 0) -> dict[str, str]:
    """Return the run's source: ``prompts`` distinct WebInstructSub rows in one parquet file
    under ``cache``, written the first time only."""
    from synthetic_sources import rows, write_parquet

    path = cache / f"deployment-{prompts}-{seed}" / "webinstructsub.parquet"
    if not path.exists():
        part = path.with_suffix(".partial")
        write_parquet(part, list(rows("webinstructsub", prompts, seed, dup_share=0.0)))
        part.rename(path)  # a file at ``path`` is always whole
    return {"name": "bench_webinstructsub", "kind": "webinstructsub", "path": str(path)}


def s3_client(tier: Tier) -> Any:
    import boto3

    conn = json.loads(json.loads((tier.state / "connections.json").read_text())["s3"])
    return boto3.client("s3", endpoint_url=conn["extra"]["endpoint_url"],
                        region_name=conn["extra"]["region_name"],
                        aws_access_key_id=conn["login"], aws_secret_access_key=conn["password"])


def table(rows: list[RunMeasure]) -> str:
    head = (f"{'run':<10} {'active':>6} {'shards':>6} {'prompts':>7} {'run s':>7} "
            f"{'window s':>8} {'busy':>6} {'idle s/server':>13} {'lost':>5} {'dup':>4}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.label:<10} {r.max_active_shards:>6} {r.shards:>6} {r.prompts:>7} "
                     f"{r.run_s:>7.1f} {r.window_s:>8.1f} {r.busy_fraction:>6.3f} "
                     f"{r.idle_per_server_s:>13.1f} {r.lost:>5} {r.duplicated:>4}")
        lines.append("  between shards (median s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in r.gaps.items())
            + f"; some shard generating {r.generating_fraction:.3f} of the time")
        lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=51,
                        help="shards of the measured run (the source has shards x shard-size "
                             "distinct prompts)")
    parser.add_argument("--shard-size", type=int, default=100, help="prompts per shard")
    parser.add_argument("--baseline-shards", type=int, default=3,
                        help="shards of the one-at-a-time baseline (0: no baseline)")
    parser.add_argument("--time-scale", type=float, default=0.4,
                        help="the stand-ins' --standin-time-scale for the runs (1: the "
                             "performance model's own pace)")
    parser.add_argument("--max-running-requests", type=int, default=32,
                        help="requests each stand-in runs at once (its batch), so a shard is "
                             "several batches deep as a real one is")
    parser.add_argument("--max-active-shards", type=int, default=3,
                        help="REGEN_MAX_ACTIVE_SHARDS of the measured run (the deployment's)")
    parser.add_argument("--cache", type=Path, default=ROOT / "var" / "bench-cache",
                        help="where the run's source file is written once and kept")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the tier's state (logs, task logs) in this directory")
    args = parser.parse_args(argv)

    t_all = time.monotonic()
    state = args.keep or Path(tempfile.mkdtemp(prefix="bench-deployment-"))
    source = bench_source(args.cache.resolve(), args.shards * args.shard_size)
    tier = Tier(state, api_port=free_port_block(),
                extra_data_roots=[str(Path(source["path"]).parent)])
    tier.overrides.update({
        "REGEN_MAX_ACTIVE_SHARDS": str(args.max_active_shards),
        "REGEN_EXTRA_SERVER_ARGS": json.dumps(
            [*STANDIN_ARGS, "--max-running-requests", str(args.max_running_requests),
             "--standin-fault-file", str(tier.fault_file)]),
    })
    rows: list[RunMeasure] = []
    restart_s = 0.0
    try:
        tier.up(log=lambda msg: print(f"[tier] {msg}", file=sys.stderr, flush=True))
        up_s = time.monotonic() - t_all
        api = tier.api()
        api.wait_for_dag(DAG_ID, timeout=180)
        s3 = s3_client(tier)
        tier.set_faults(time_scale=args.time_scale)
        conf = tier.run_conf(run_name="bench", sources=[source], shard_size=args.shard_size,
                             progress_interval_s=30)
        rows.append(measure(tier, api, s3, conf, "measured", args.max_active_shards, 900))
        if rows[0].shards < 50:
            rows[0].notes.append(f"only {rows[0].shards} shards: use more --shards")
        if args.baseline_shards:
            restart_s = restart_for(tier, api, 1)
            base = {**conf, "force_regenerate": True,
                    "shard_range": f"0-{args.baseline_shards - 1}"}
            rows.append(measure(tier, api, s3, base, "baseline", 1, 900))
    finally:
        tier.down(log=lambda msg: print(f"[tier] {msg}", file=sys.stderr, flush=True))
        remove_database(tier)
        if args.keep is None:
            shutil.rmtree(state, ignore_errors=True)
    seconds = time.monotonic() - t_all

    print(table(rows))
    print(f"tier up {up_s:.0f} s, restart for the baseline {restart_s:.0f} s, "
          f"{seconds:.0f} s in all")
    main_run = rows[0]
    out = {"bench": "deployment", **main_run.to_dict(), "servers": main_run.servers,
           "time_scale": args.time_scale, "shard_size": args.shard_size,
           "max_running_requests": args.max_running_requests,
           "bench_seconds": round(seconds, 1)}
    if len(rows) > 1:
        out["baseline"] = rows[1].to_dict()
        out["baseline_busy_fraction"] = out["baseline"]["busy_fraction"]
    print(json.dumps(out))
    return 0 if not any(r.notes for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
