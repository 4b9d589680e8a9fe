"""Fan-out: keep the servers busy across shard boundaries, through the task code path.

Every shard ends with a drain while its longest requests finish; with one shard at a time the
GPUs idle at every boundary. This runs a multi-shard job the way the DAG does, calling the
generate task's body (``include.generation.shard.generate_shard``) once per shard with the
start stagger the prepare task plans (``include.prompts.plan.stagger``), with
``REGEN_MAX_ACTIVE_SHARDS`` (the DAG's default) shards in flight sharing eight stand-in
servers, and then, in the same run, with one shard at a time. The whole-job throughput
(servers' own token counters, job start to last shard done) is compared with the stand-ins'
ceiling.

    python -m benchmarks.bench_fanout [--shards 12] [--shard-size 1000]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import Sampler, bench_settings, realistic_prompts, standin_fleet
from include.generation.shard import generate_shard
from include.layout import MANIFEST_KEY, shard_id, shard_key
from include.pipeline.prepare_prompts import stagger
from include.prompts.encoding import encode_record
from include.settings import RunSettings
from include.storage import LocalStore


def default_shards_in_flight() -> int:
    """Return the DAG's default cap on shards in flight (read from the DAG module)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "dags" / "regenerate_drafter_data.py"
    spec = importlib.util.spec_from_file_location("regen_dag", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.MAX_ACTIVE_SHARDS)


def run_job(label: str, in_flight: int, urls: list[str], settings_values: dict,
            n_shards: int, prompts: list[dict], ceiling: float) -> dict[str, float]:
    """Generate every shard with ``in_flight`` at once; return whole-job figures."""
    work = Path(tempfile.mkdtemp(prefix=f"fanout-{label}-"))
    store = LocalStore(work)
    size = len(prompts) // n_shards
    for n in range(n_shards):
        store.write_new(shard_key(n), b"".join(encode_record(p)
                                               for p in prompts[n * size:(n + 1) * size]))
    store.write_new(MANIFEST_KEY, json.dumps(
        {"shards": [{"shard_id": shard_id(n), "count": size} for n in range(n_shards)]}
    ).encode())
    settings = bench_settings({**settings_values, "run_name": label}, output_root=str(work))
    ids = [shard_id(n) for n in range(n_shards)]
    waits = stagger(ids, in_flight)  # what the DAG's prepare task hands each shard
    with Sampler(urls) as sampler:
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            results = list(pool.map(
                lambda n: generate_shard(settings, ids[n], urls, store, wait_for=waits[n]),
                range(n_shards)))
        end = time.monotonic()
    tokens = sampler.tokens_at(end) - sampler.tokens_at(start)
    completed = sum(r["counts"]["completed"] for r in results)
    return {"seconds": end - start, "tokens_per_s": tokens / (end - start),
            "ratio": tokens / (end - start) / ceiling, "completed": completed}


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--shard-size", type=int,
                        default=RunSettings.model_fields["shard_size"].default,
                        help="prompts per shard (default: the shard_size setting's default)")
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()
    in_flight = default_shards_in_flight()

    with standin_fleet("fanout", standin_time_scale=args.time_scale,
                       enable_metrics=True) as fleet:
        prompts = realistic_prompts(args.shards * args.shard_size, seed=11)
        values = {"model_path": str(fleet.tokenizer_dir), "max_tokens": args.max_tokens,
                  "progress_interval_s": 30, "context_length": 32768}
        job = (fleet.urls, values, args.shards, prompts, fleet.ceiling_tokens_per_s)
        fanned = run_job("fanout", in_flight, *job)
        sequential = run_job("sequential", 1, *job)
        ceiling = fleet.ceiling_tokens_per_s
    print(f"{'shards in flight':<20}{'tok/s':>10}{'ratio':>8}{'seconds':>9}{'completed':>11}")
    for name, r in ((f"{in_flight} (default)", fanned), ("1 (sequential)", sequential)):
        print(f"{name:<20}{r['tokens_per_s']:>10.0f}{r['ratio']:>8.3f}{r['seconds']:>9.1f}"
              f"{r['completed']:>11}")
    print(f"ceiling (8 stand-ins): {ceiling:.0f} tok/s")
    print(json.dumps({
        "bench": "fanout",
        "shards": args.shards,
        "shard_size": args.shard_size,
        "shards_in_flight": in_flight,
        "ratio_to_ceiling": round(fanned["ratio"], 4),
        "sequential_ratio_to_ceiling": round(sequential["ratio"], 4),
        "tokens_per_s": round(fanned["tokens_per_s"], 1),
        "sequential_tokens_per_s": round(sequential["tokens_per_s"], 1),
        "ceiling_tokens_per_s": round(ceiling, 1),
        "seconds": round(fanned["seconds"], 2),
        "sequential_seconds": round(sequential["seconds"], 2),
    }))


if __name__ == "__main__":
    main()
