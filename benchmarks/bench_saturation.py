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

    python -m benchmarks.bench_saturation [--prompts 4000] [--time-scale 0.25]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from include.generation.engine import EngineConfig, run_shard
from include.generation.journal import FileJournal
from include.settings import RunSettings
from include.tokenization import count_prompt_tokens, load_tokenizer
from sglang_standin.process import StandinProcess
from sglang_standin.tokenizer import build_chat_tokenizer
from synthetic_sources import rows

SERVERS = 8


def _prompts(n: int, seed: int) -> list[dict[str, Any]]:
    kinds = ["metamathqa", "codefeedback", "webinstructsub"]
    out = []
    rng = random.Random(seed)
    for i in range(n):
        row = next(rows(kinds[i % 3], 1, seed=seed + i, dup_share=0))
        text = row.get("query") or row.get("question")
        out.append({"id": f"bench:{i}", "source": kinds[i % 3], "metadata": {},
                    "messages": [{"role": "user", "content": text[: rng.randint(200, 4000)]}]})
    return out


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _gen_tokens(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        for line in _get(url + "/metrics").splitlines():
            if line.startswith("sglang:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


class Sampler(threading.Thread):
    """Sample the servers' generated-token counters every ``interval`` seconds."""

    def __init__(self, urls: list[str], interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.urls, self.interval = urls, interval
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append((time.monotonic(), _gen_tokens(self.urls)))
            self.stop_event.wait(self.interval)

    def tokens_at(self, t: float) -> float:
        """Return the counter at time ``t``, interpolated between samples."""
        prev = self.samples[0]
        for sample in self.samples:
            if sample[0] >= t:
                if sample[0] == prev[0]:
                    return sample[1]
                frac = (t - prev[0]) / (sample[0] - prev[0])
                return prev[1] + frac * (sample[1] - prev[1])
            prev = sample
        return self.samples[-1][1]


def measure(label: str, urls: list[str], prompts: list[dict], config: EngineConfig,
            counter: Any, ceiling: float) -> dict[str, float]:
    """Run one shard through the engine and return its throughput figures."""
    sampler = Sampler(urls)
    sampler.start()
    time.sleep(0.6)
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_shard(f"bench-{label}", prompts, urls, FileJournal(Path(tmp) / "j.jsonl"),
                            config, counter)
    time.sleep(0.6)
    sampler.stop_event.set()
    sampler.join()
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


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--time-scale", type=float, default=0.25,
                        help="stand-in time scale (1.0: ~1,400 tok/s per server at full batch)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-saturation-"))
    tok_dir = build_chat_tokenizer(work / "tokenizer")
    flags = {"standin_time_scale": args.time_scale, "standin_warmup_seconds": 0.1,
             "enable_metrics": True, "context_length": 32768, "log_level": "warning"}
    procs = [StandinProcess(tok_dir, **flags) for _ in range(SERVERS)]
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_healthy(timeout=120)
        urls = [p.url for p in procs]
        ceiling = sum(json.loads(_get(u + "/get_server_info"))["standin_ceiling_gen_throughput"]
                      for u in urls)
        tokenizer = load_tokenizer(str(tok_dir))
        counter = lambda convs: count_prompt_tokens(tokenizer, convs, True)  # noqa: E731
        prompts = _prompts(args.prompts, seed=7)
        defaults = RunSettings.from_mapping({"max_tokens": args.max_tokens,
                                             "model_path": "bench", "progress_interval_s": 10})
        engine = EngineConfig.from_settings(defaults)
        baseline = EngineConfig.from_settings(defaults, concurrency_mode="fixed",
                                              in_flight_per_server=32)
        ours = measure("engine", urls, prompts, engine, counter, ceiling)
        base = measure("fixed32", urls, prompts, baseline, counter, ceiling)
    finally:
        for p in procs:
            p.stop()

    print(f"{'config':<22}{'tok/s':>10}{'ratio':>8}{'steady':>8}{'seconds':>9}{'drain s':>9}")
    for name, r in (("engine (adaptive)", ours), ("fixed 32/server", base)):
        print(f"{name:<22}{r['tokens_per_s']:>10.0f}{r['ratio']:>8.3f}{r['steady_ratio']:>8.3f}"
              f"{r['seconds']:>9.1f}{r['drain_s']:>9.1f}")
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
        "seconds": round(ours["seconds"], 2),
        "drain_seconds": round(ours["drain_s"], 2),
    }))


if __name__ == "__main__":
    main()
