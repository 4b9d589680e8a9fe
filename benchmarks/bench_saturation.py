"""Saturation: how close the engine keeps eight servers to their throughput ceiling.

Starts eight stand-in servers with the performance model (a decode step whose time grows with
the batch, at most ``max_running_requests`` decoding at once), runs one shard of realistic
prompts through the engine with the run's default settings (adaptive concurrency), then, in the
same run on the same servers and prompts, through the configuration the original run used
(fixed 32 in flight per server). Throughput comes from the servers' own
``sglang:generation_tokens_total`` counters, sampled every 0.5 s; the ceiling is what the
stand-ins report at a full batch.

* whole-run ratio: output tokens / run time (drain included) / ceiling
* steady-state ratio: tokens/s between 10% of the run and the last dispatch / ceiling
* task ratio: the same shard as the generate task runs it (``generate_shard`` in a fresh
  process, the prompt shard in a local store, the tokenizer loaded there), from the task's
  start (its Python started and Airflow's task SDK imported, as a task runner has it) to its
  end; ``first_request_s`` is when its first request left, after the task's start. Its
  baseline, in the same run: the same task with the tokenizer loaded before anything else and
  every prompt counted before it is sent (how the task started before ``startup``)

    python -m benchmarks.bench_saturation [--prompts 4000] [--time-scale 0.25]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    SERVERS,
    Sampler,
    bench_settings,
    realistic_prompts,
    standin_fleet,
)
from include.durability.journal import FileJournal
from include.engine.dispatch import EngineConfig, run_shard
from include.layout import shard_key
from include.prompts.encoding import encode_record
from include.storage import LocalStore
from include.target_tokenizer import count_prompt_tokens, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def measure(label: str, urls: list[str], prompts: list[dict], config: EngineConfig,
            counter: Any, ceiling: float) -> dict[str, float]:
    """Run one shard through the engine and return its throughput figures."""
    with Sampler(urls) as sampler, tempfile.TemporaryDirectory() as tmp:
        outcome = run_shard(f"bench-{label}", prompts, urls, FileJournal(Path(tmp) / "j.jsonl"),
                            config, counter)
    t0 = outcome.started_monotonic
    end = t0 + outcome.elapsed_s
    whole = (sampler.tokens_at(end) - sampler.tokens_at(t0)) / outcome.elapsed_s
    warm = t0 + 0.1 * outcome.elapsed_s
    drain = t0 + outcome.last_dispatch_s
    steady = (sampler.tokens_at(drain) - sampler.tokens_at(warm)) / max(drain - warm, 1e-9)
    return {
        "tokens_per_s": whole,
        "ratio": whole / ceiling,
        "steady_tokens_per_s": steady,
        "steady_ratio": steady / ceiling,
        "seconds": outcome.elapsed_s,
        "drain_s": outcome.elapsed_s - outcome.last_dispatch_s,
        "completed": outcome.counts["completed"],
        "final_windows": [s["final_window"] for s in outcome.servers],
    }


def task_child(store_dir: str, tokenizer_dir: str, urls: str, max_tokens: int,
               tokenizer_first: bool) -> None:
    """In a fresh process: run shard 0 as the generate task does; print its times as JSON.

    ``tokenizer_first``: the task waits for its tokenizer where it starts loading it, so every
    prompt is counted before it is sent (the baseline).
    """
    import airflow.sdk  # noqa: F401 - what a task runner has imported before the task starts

    started = time.monotonic()
    from include.engine import client
    from include.engine.startup import PromptCounter
    from include.generation import shard
    from include.generation.shard import generate_shard

    class TokenizerFirst(PromptCounter):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.tokenizer  # noqa: B018 - waits for the load, as the task once did

    if tokenizer_first:
        shard.PromptCounter = TokenizerFirst

    first: list[float] = []
    send = client.send_chat

    def timed_send(*args: Any, **kwargs: Any) -> Any:
        if not first:
            first.append(time.monotonic())
        return send(*args, **kwargs)

    client.send_chat = timed_send
    settings = bench_settings({"max_tokens": max_tokens, "model_path": tokenizer_dir,
                               "run_name": "bench", "progress_interval_s": 10},
                              output_root=store_dir)
    summary = generate_shard(settings, "shard-00000", urls.split(","), LocalStore(store_dir))
    print(json.dumps({"started": started, "first_request": first[0], "ended": time.monotonic(),
                      "completed": summary["counts"]["completed"]}))


def measure_task(urls: list[str], tokenizer_dir: Path, prompts: list[dict], max_tokens: int,
                 ceiling: float, tokenizer_first: bool = False) -> dict[str, float]:
    """Run shard 0 in a fresh process (``task_child``); return its figures from its start."""
    with Sampler(urls) as sampler, tempfile.TemporaryDirectory() as tmp:
        LocalStore(tmp).write_new(shard_key(0), b"".join(encode_record(p) for p in prompts))
        # Bytecode cached as on a worker whose image has run Python before.
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "PYTHONPYCACHEPREFIX": str(ROOT / "var" / "bench-cache" / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        spawned = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_saturation", "--task-child", tmp,
             str(tokenizer_dir), ",".join(urls), str(max_tokens),
             "first" if tokenizer_first else "lazy"],
            capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if done.returncode:
            raise SystemExit(f"the task process failed:\n{done.stderr[-3000:]}")
        times = json.loads(done.stdout.strip().splitlines()[-1])
    start, end = times["started"], times["ended"]
    whole = (sampler.tokens_at(end) - sampler.tokens_at(start)) / (end - start)
    return {"ratio": whole / ceiling, "tokens_per_s": whole, "seconds": end - start,
            "first_request_s": times["first_request"] - start,
            "process_first_request_s": times["first_request"] - spawned,
            "completed": times["completed"]}


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--time-scale", type=float, default=0.25,
                        help="stand-in time scale (1.0: ~1,400 tok/s per server at full batch)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--task-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task_child:
        store_dir, tokenizer_dir, urls, max_tokens, order = args.task_child
        task_child(store_dir, tokenizer_dir, urls, int(max_tokens), order == "first")
        return

    with standin_fleet("saturation", standin_time_scale=args.time_scale,
                       enable_metrics=True) as fleet:
        urls, ceiling = fleet.urls, fleet.ceiling_tokens_per_s
        tokenizer = load_tokenizer(str(fleet.tokenizer_dir))
        counter = lambda convs: count_prompt_tokens(tokenizer, convs, True)  # noqa: E731
        prompts = realistic_prompts(args.prompts, seed=7)
        defaults = bench_settings({"max_tokens": args.max_tokens, "model_path": "bench",
                                   "progress_interval_s": 10})
        engine = EngineConfig.from_settings(defaults)
        baseline = EngineConfig.from_settings(defaults, concurrency_mode="fixed",
                                              in_flight_per_server=32)
        ours = measure("engine", urls, prompts, engine, counter, ceiling)
        base = measure("fixed32", urls, prompts, baseline, counter, ceiling)
        task = measure_task(urls, fleet.tokenizer_dir, prompts, args.max_tokens, ceiling)
        task_base = measure_task(urls, fleet.tokenizer_dir, prompts, args.max_tokens, ceiling,
                                 tokenizer_first=True)

    print(f"{'config':<22}{'tok/s':>10}{'ratio':>8}{'steady':>8}{'seconds':>9}{'drain s':>9}")
    for name, r in (("engine (adaptive)", ours), ("fixed 32/server", base)):
        print(f"{name:<22}{r['tokens_per_s']:>10.0f}{r['ratio']:>8.3f}{r['steady_ratio']:>8.3f}"
              f"{r['seconds']:>9.1f}{r['drain_s']:>9.1f}")
    for name, r in (("generate task", task), ("task, tokenizer first", task_base)):
        print(f"{name:<22}{r['tokens_per_s']:>10.0f}{r['ratio']:>8.3f}{'':>8}"
              f"{r['seconds']:>9.1f}   first request {r['first_request_s']:.2f} s after the "
              f"task's start ({r['process_first_request_s']:.2f} s after its process's)")
    print(f"ceiling (8 stand-ins): {ceiling:.0f} tok/s; engine windows at the end: "
          f"{ours['final_windows']}")
    print(json.dumps({
        "bench": "saturation",
        "prompts": args.prompts,
        "servers": SERVERS,
        "ratio_to_ceiling": round(ours["ratio"], 4),
        "steady_ratio_to_ceiling": round(ours["steady_ratio"], 4),
        "baseline_ratio_to_ceiling": round(base["ratio"], 4),
        "baseline_steady_ratio_to_ceiling": round(base["steady_ratio"], 4),
        "tokens_per_s": round(ours["tokens_per_s"], 1),
        "baseline_tokens_per_s": round(base["tokens_per_s"], 1),
        "ceiling_tokens_per_s": round(ceiling, 1),
        "task_ratio_to_ceiling": round(task["ratio"], 4),
        "task_first_request_s": round(task["first_request_s"], 2),
        "task_process_first_request_s": round(task["process_first_request_s"], 2),
        "task_seconds": round(task["seconds"], 2),
        "baseline_task_ratio_to_ceiling": round(task_base["ratio"], 4),
        "baseline_task_first_request_s": round(task_base["first_request_s"], 2),
        "baseline_task_seconds": round(task_base["seconds"], 2),
        "seconds": round(ours["seconds"], 2),
        "drain_seconds": round(ours["drain_s"], 2),
    }))


if __name__ == "__main__":
    main()
