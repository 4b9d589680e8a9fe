"""The rehearsal's parts that run alone at the planned size (``bench_rehearsal --parts``).

In a child process (its peak memory is its own): the prepare task's body
(``include.pipeline.prepare_prompts.plan_run``) over the rehearsal's synthetic sources into a local
output root (time, peak RSS, the plan's XCom size in bytes and per shard), then one run
monitor refresh over that run folder (``RunMonitor.live_runs``, no cache: time, Python peak
memory), as the monitor sees a run whose shards are all planned.

    .venv/bin/python -m benchmarks.bench_rehearsal --parts --prompts 654676 --shard-size 1000
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from scripts.deploy import ROOT
from synthetic_sources.rehearsal import rehearsal_sources


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Prepare, plan and one monitor refresh; return their figures."""
    import logging

    from benchmarks.common import bench_settings
    from include.monitor.runs import RunMonitor
    from include.pipeline.airflow_state import max_map_length
    from include.pipeline.prepare_prompts import plan_run
    from include.storage import LocalStore

    logging.basicConfig(level=logging.WARNING)
    settings = bench_settings({"sources": spec["sources"], "run_name": "rehearsal",
                               "shard_size": spec["shard_size"]},
                              output_root=spec["out"], source_catalogue={})
    max_map_length()  # Airflow's configuration loaded before the clock starts
    t = time.perf_counter()
    plan = plan_run(settings, "rehearsal", shards_in_flight=3)
    prepare_s = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    xcom = len(json.dumps(plan))
    tracemalloc.start()
    t = time.perf_counter()
    states = RunMonitor(LocalStore(spec["out"]), ttl_s=0.0).live_runs()
    refresh_s = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return {"shards": len(plan), "prepare_s": round(prepare_s, 2),
            "prepare_peak_rss_mib": round(rss, 1), "prepare_worker_peak_rss_mib": round(workers, 1),
            "plan_xcom_bytes": xcom, "plan_xcom_bytes_per_shard": round(xcom / len(plan), 1),
            "monitor_refresh_s": round(refresh_s, 4), "monitor_peak_mib": round(peak, 2),
            "monitor_runs": len(states)}


def main(prompts: int, shard_size: int, conversation_share: float, cache: Path) -> int:
    """Measure at ``prompts`` prompts in shards of ``shard_size``; print one JSON line."""
    t = time.perf_counter()
    sources = rehearsal_sources(cache.resolve(), prompts, conversation_share)
    sources_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="rehearsal-parts-") as out:
        spec = {"sources": sources, "shard_size": shard_size, "out": out}
        done = subprocess.run([sys.executable, "-m", "benchmarks.rehearsal_parts",
                               json.dumps(spec)], capture_output=True, text=True, cwd=ROOT,
                              check=False)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{prompts} prompts, {figures['shards']} shards: prepare {figures['prepare_s']} s "
          f"(peak {figures['prepare_peak_rss_mib']} MiB + worker "
          f"{figures['prepare_worker_peak_rss_mib']} MiB), plan XCom "
          f"{figures['plan_xcom_bytes']} B, monitor refresh {figures['monitor_refresh_s']} s")
    print(json.dumps({"bench": "rehearsal_parts", "prompts": prompts, "shard_size": shard_size,
                      "sources_written_s": round(sources_s, 1), **figures}))
    return 0


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))))
