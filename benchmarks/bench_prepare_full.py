"""Benchmark the prepare stage at the sources' published sizes (3.55M rows, ~9 GB on disk).

    python -m benchmarks.bench_prepare_full [--scale 1.0] [--cache var/bench-cache]
        [--shard-size 2000] [--seed 0] [--baseline-limit-mb 10240] [--skip-baseline]

1. Writes the six sources in their published formats and layouts at ``--scale`` times their
   published rows and bytes (``synthetic_sources.scaled``), once, into
   ``<cache>/prepare-full-<scale>-<seed>/data``; later runs reuse it (9 GB take minutes).
2. ``ours``, in a child process: the prepare task's body,
   ``include.pipeline.prepare_prompts.plan_run`` (``prepare_prompts``, then the shard plan),
   with ``AIRFLOW__CORE__MAX_MAP_LENGTH`` raised as the plan's own message asks when a run
   maps more shards than Airflow's default 1,024.
   Afterwards the plan's check is run again at the default limit, to show what a run hears.
3. ``baseline``, in another child: the straightforward pandas job (``read_parquet`` /
   ``read_json`` per file, the prompt column, ``drop_duplicates`` across all sources, a seeded
   shuffle, JSONL shards of the same size), its address space limited to
   ``--baseline-limit-mb`` (``RLIMIT_AS``) so that it cannot take the shared machine's memory:
   if it runs out, it reports the source it stopped at and its time until then.

Prints a table, then one JSON object on the last line: ``bench``, ``rows``, ``data_mb``,
``seconds``, ``peak_rss_mb`` (the stage's process plus its worker: the sum of their peaks, an
upper bound), ``peak_rss_sampled_mb`` and ``peak_pss_sampled_mb`` (the largest sums over
the processes sampled together every 0.1 s; PSS counts the pages they share since the fork
once), ``kept``, ``shards``, ``baseline_seconds``, ``baseline_peak_rss_mb``,
``baseline_finished`` (false: it ran out of memory; ``baseline_stopped_at`` names the source),
``rows_per_s``, ``scale``, ``cpu_count``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_prepare import _first_human, _peak_rss_mb, _table, _workers_peak_rss_mb

RSS_TARGET_MB = 3072
_SETTINGS_KEYS = ("name", "kind", "config", "path", "multi_turn")


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the prepare task's body over the spec's sources; return its figures."""
    import logging

    from benchmarks.common import bench_settings
    from include.pipeline.airflow_state import max_map_length
    from include.pipeline.prepare_prompts import check_map_length, plan_run
    from include.settings import SettingsError

    logging.basicConfig(level=logging.WARNING)
    settings = bench_settings(
        {
            "sources": [{k: s[k] for k in _SETTINGS_KEYS if k in s} for s in spec["sources"]],
            "run_name": "bench",
            "shard_size": spec["shard_size"],
            "seed": spec["seed"],
        },
        output_root=spec["out"],
        source_catalogue={},  # the sources are named with their paths
    )
    max_map_length()  # Airflow's configuration loaded before the clock starts
    start = time.perf_counter()
    plan = plan_run(settings, "bench", shards_in_flight=3)
    seconds = time.perf_counter() - start
    own, workers = _peak_rss_mb(), _workers_peak_rss_mb()
    manifest = json.loads((Path(settings.run_uri) / "prompts" / "manifest.json").read_text())
    try:
        check_map_length(settings, [p["shard_id"] for p in plan], len(plan), limit=1024)
        at_default = "accepted"
    except SettingsError as exc:
        at_default = str(exc)
    return {
        "seconds": seconds,
        "peak_rss_mb": own + workers,
        "peak_rss_main_mb": own,
        "peak_rss_workers_mb": workers,
        "read": manifest["totals"]["read"],
        "kept": manifest["totals"]["kept"],
        "shards": len(plan),
        "at_default_map_length": at_default,
    }


def run_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """The pandas job, reporting each source as it finishes (the last report says where it
    stopped if it runs out of memory)."""
    import pandas as pd

    limit = spec["baseline_limit_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    start = time.perf_counter()
    frames: list[Any] = []
    read = 0
    stage = "loading"
    try:
        for s in spec["sources"]:
            stage = s["name"]
            path = Path(s["path"])
            if s["format"] == "parquet":
                files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
                df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            else:
                df = pd.read_json(path, lines=s["format"] == "jsonl")
            read += len(df)
            col = s["prompt"]
            prompt = df[col].apply(_first_human) if col == "conversations" else df[col]
            frames.append(pd.DataFrame({"source": s["name"], "prompt": prompt}))
            del df, prompt
            _report({"loaded": s["name"], "read": read, "seconds": time.perf_counter() - start})
        stage = "drop_duplicates and shuffle"
        data = pd.concat(frames, ignore_index=True)
        del frames[:]
        data = data.dropna(subset=["prompt"]).drop_duplicates(subset="prompt")
        data = data.sample(frac=1, random_state=spec["seed"])
        stage = "writing shards"
        out = Path(spec["out"])
        out.mkdir(parents=True, exist_ok=True)
        size = spec["shard_size"]
        n_shards = math.ceil(len(data) / size)
        for n in range(n_shards):
            data.iloc[n * size : (n + 1) * size].to_json(
                out / f"shard-{n:05d}.jsonl", orient="records", lines=True, force_ascii=False
            )
    except Exception as exc:  # noqa: BLE001 - out of memory shows as MemoryError or ArrowException
        frames.clear()
        data = None
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
        return {"finished": False, "stopped_at": stage, "error": error,
                "seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb(),
                "read": read, "kept": 0, "shards": 0}
    return {"finished": True, "seconds": time.perf_counter() - start,
            "peak_rss_mb": _peak_rss_mb(), "read": read, "kept": len(data), "shards": n_shards}


def _report(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _child(job: str, spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if job == "ours":  # imports done before the clock starts
        import pyarrow.json  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    else:
        import pandas  # noqa: F401
    _report((run_ours if job == "ours" else run_baseline)(spec))


class _TreeRss(threading.Thread):
    """Sample the summed RSS and PSS of a process and its children every 0.1 s; keep the
    largest sums (PSS counts a page shared since a fork once, RSS in every process)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.peak_mb = self.peak_pss_mb = 0.0

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self.done.wait(0.1):
            try:
                procs = [root, *root.children(recursive=True)]
                full = [p.memory_full_info() for p in procs]
            except psutil.Error:
                continue
            self.peak_mb = max(self.peak_mb, sum(m.rss for m in full) / 2**20)
            self.peak_pss_mb = max(self.peak_pss_mb, sum(m.pss for m in full) / 2**20)


def _spawn(job: str, spec: dict[str, Any], work: Path) -> tuple[dict[str, Any], _TreeRss]:
    out = work / f"out-{job}"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: prepare must not reuse the last one
    spec_path = work / f"spec-{job}.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out)}))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(work / "hf-cache"),
        "TMPDIR": str(work),
        "AIRFLOW_HOME": os.environ.get("AIRFLOW_HOME", str(work / "airflow-home")),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # What a deployment sets when the plan says a run maps more than the default 1,024.
        "AIRFLOW__CORE__MAX_MAP_LENGTH": "100000",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_prepare_full", "--child", job, "--spec",
         str(spec_path)],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    sampler = _TreeRss(proc.pid)
    sampler.start()
    stdout, _ = proc.communicate()
    sampler.done.set()
    sampler.join()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines or "loaded" in lines[-1]:
        if job == "ours":
            raise SystemExit(f"{job} child failed with exit code {proc.returncode}")
        last = lines[-1] if lines else {"loaded": "nothing", "seconds": math.nan, "read": 0}
        return {"finished": False, "stopped_at": f"after loading {last['loaded']}",
                "error": f"exit code {proc.returncode}", "seconds": last["seconds"],
                "peak_rss_mb": sampler.peak_mb, "read": last["read"], "kept": 0,
                "shards": 0}, sampler
    return lines[-1], sampler


def _data(cache: Path, scale: float, seed: int) -> tuple[Path, list[dict[str, Any]], float]:
    """Return the work directory and the sources, writing them first if not cached yet."""
    from synthetic_sources.scaled import write_published

    work = cache / f"prepare-full-{scale:g}-{seed}"
    listing = work / "data" / "sources.json"
    if listing.exists():
        return work, json.loads(listing.read_text()), 0.0
    shutil.rmtree(work / "data", ignore_errors=True)  # a write cut short: start again
    t0 = time.perf_counter()
    sources = write_published(work / "data", scale, seed, log=lambda m: print(m, flush=True))
    listing.write_text(json.dumps(sources))  # last: marks the data complete
    return work, sources, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the published rows and bytes (e.g. 0.1)")
    parser.add_argument("--cache", default="var/bench-cache",
                        help="where the data is written once and reused")
    parser.add_argument("--shard-size", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-limit-mb", type=int, default=10240,
                        help="address-space limit of the pandas baseline's process")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--child", choices=("ours", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.spec)
        return 0
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")

    work, sources, gen_seconds = _data(Path(args.cache).resolve(), args.scale, args.seed)
    data_mb = sum(f.stat().st_size for f in (work / "data").rglob("*") if f.is_file()) / 2**20
    rows = sum(s["rows"] for s in sources)
    print(f"data: {rows:,} rows, {data_mb:,.0f} MB in {work / 'data'}"
          + (f" (written in {gen_seconds:.0f} s)" if gen_seconds else " (cached)"), flush=True)
    spec = {"sources": sources, "shard_size": args.shard_size, "seed": args.seed,
            "baseline_limit_mb": args.baseline_limit_mb}
    ours, ours_sampled = _spawn("ours", spec, work)
    print(f"prepare (plan_run): {ours['seconds']:.1f} s, peak RSS {ours['peak_rss_mb']:,.0f} MB "
          f"(main + worker), {ours['shards']:,} shards", flush=True)
    shutil.rmtree(work / "out-ours", ignore_errors=True)  # gigabytes of shards
    if args.skip_baseline:
        base = {"finished": False, "stopped_at": "skipped", "seconds": math.nan,
                "peak_rss_mb": math.nan, "read": 0, "kept": 0, "shards": 0}
        base_sampled = _TreeRss(0)
    else:
        base, base_sampled = _spawn("baseline", spec, work)
        shutil.rmtree(work / "out-baseline", ignore_errors=True)

    finished = base["finished"]
    base_label = "pandas baseline" + ("" if finished else f" (stopped: {base['stopped_at']})")
    print()
    print(_table([
        ("", "prepare (plan_run)", base_label),
        ("rows read", f"{ours['read']:,}", f"{base['read']:,}"),
        ("prompts kept", f"{ours['kept']:,}", f"{base['kept']:,}" if finished else "-"),
        ("shards", f"{ours['shards']:,}", f"{base['shards']:,}" if finished else "-"),
        ("seconds", f"{ours['seconds']:.1f}", f"{base['seconds']:.1f}"),
        ("rows/s", f"{ours['read'] / ours['seconds']:,.0f}",
         f"{base['read'] / base['seconds']:,.0f}" if base["seconds"] else "-"),
        ("peak RSS (MB), sum of peaks", f"{ours['peak_rss_mb']:,.0f}",
         f"{base['peak_rss_mb']:,.0f}"),
        ("  main + worker", f"{ours['peak_rss_main_mb']:,.0f} + "
         f"{ours['peak_rss_workers_mb']:,.0f}", ""),
        ("peak RSS (MB), sampled together", f"{ours_sampled.peak_mb:,.0f}",
         f"{base_sampled.peak_mb:,.0f}"),
        ("peak PSS (MB), sampled together", f"{ours_sampled.peak_pss_mb:,.0f}",
         f"{base_sampled.peak_pss_mb:,.0f}"),
    ]))
    print(f"at Airflow's default max_map_length: {ours['at_default_map_length']}")
    print(f"peak RSS target {RSS_TARGET_MB} MB "
          f"{'met' if ours['peak_rss_mb'] <= RSS_TARGET_MB else 'MISSED'}; baseline "
          + (f"{base['seconds'] / ours['seconds']:.2f}x our time" if finished else
             f"did not finish within {args.baseline_limit_mb} MB ({base.get('error')}, "
             f"stopped at {base['stopped_at']} after {base['seconds']:.1f} s)"))
    result = {
        "bench": "prepare_full",
        "scale": args.scale,
        "rows": rows,
        "data_mb": round(data_mb, 1),
        "seconds": round(ours["seconds"], 2),
        "rows_per_s": round(ours["read"] / ours["seconds"], 1),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1),
        "peak_rss_main_mb": round(ours["peak_rss_main_mb"], 1),
        "peak_rss_workers_mb": round(ours["peak_rss_workers_mb"], 1),
        "peak_rss_sampled_mb": round(ours_sampled.peak_mb, 1),
        "peak_pss_sampled_mb": round(ours_sampled.peak_pss_mb, 1),
        "kept": ours["kept"],
        "shards": ours["shards"],
        "baseline_seconds": round(base["seconds"], 2),
        "baseline_peak_rss_mb": round(base["peak_rss_mb"], 1),
        "baseline_finished": finished,
        "baseline_stopped_at": None if finished else base["stopped_at"],
        "baseline_limit_mb": args.baseline_limit_mb,
        "baseline_kept": base["kept"],
        "rss_target_mb": RSS_TARGET_MB,
        "shard_size": args.shard_size,
        "cpu_count": os.cpu_count(),
    }
    # A baseline that did not run or finish has no figure: null, as JSON has no NaN.
    result = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in result.items()}
    print(json.dumps(result, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
