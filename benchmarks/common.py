"""What the benchmarks share: a fleet of stand-in servers, realistic prompts, a token sampler."""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from include.engine.pool import parse_metrics
from sglang_standin.process import StandinProcess
from sglang_standin.tokenizer import build_chat_tokenizer
from synthetic_sources import rows

#: One server per GPU of an 8-GPU host.
SERVERS = 8


@dataclass(frozen=True)
class Fleet:
    """Running stand-in servers: their URLs, the tokenizer they serve, their ceiling."""

    urls: list[str]
    tokenizer_dir: Path
    ceiling_tokens_per_s: float


def get(url: str) -> str:
    """Return the body of a GET (for the servers' own reports)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


@contextlib.contextmanager
def standin_fleet(prefix: str, n: int = SERVERS, **flags: Any) -> Iterator[Fleet]:
    """Start ``n`` stand-ins with ``flags`` (plus quiet, fast warm-up defaults); stop them after.

    The ceiling is the sum of what each server reports as its full-batch output tokens/s.
    """
    work = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    tok_dir = build_chat_tokenizer(work / "tokenizer")
    merged = {"standin_warmup_seconds": 0.1, "log_level": "warning", "context_length": 32768,
              **flags}
    procs = [StandinProcess(tok_dir, **merged) for _ in range(n)]
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_healthy(timeout=120)
        urls = [p.url for p in procs]
        ceiling = sum(
            json.loads(get(u + "/get_server_info")).get("standin_ceiling_gen_throughput", 0.0)
            for u in urls
        )
        yield Fleet(urls, tok_dir, ceiling)
    finally:
        for p in procs:
            p.stop()


def realistic_prompts(n: int, seed: int) -> list[dict[str, Any]]:
    """Return ``n`` single-turn prompt records of mixed sources and lengths."""
    kinds = ["metamathqa", "codefeedback", "webinstructsub"]
    out = []
    rng = random.Random(seed)
    for i in range(n):
        row = next(rows(kinds[i % 3], 1, seed=seed + i, dup_share=0))
        text = row.get("query") or row.get("question")
        out.append({"id": f"bench:{i}", "source": kinds[i % 3], "metadata": {},
                    "messages": [{"role": "user", "content": text[: rng.randint(200, 4000)]}]})
    return out


def _generated_tokens(urls: list[str]) -> float:
    return sum(parse_metrics(get(url + "/metrics")).get("sglang:generation_tokens_total", 0.0)
               for url in urls)


class Sampler(threading.Thread):
    """Sample the servers' generated-token counters every ``interval`` seconds."""

    def __init__(self, urls: list[str], interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.urls, self.interval = urls, interval
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.samples.append((time.monotonic(), _generated_tokens(self.urls)))
            except OSError:  # a server too busy to answer in time: the next sample counts
                pass
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

    def __enter__(self) -> Sampler:
        self.start()
        time.sleep(self.interval + 0.1)  # a first sample before the measured work starts
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(self.interval + 0.1)  # a last sample after it ends
        self.stop_event.set()
        self.join()


def bench_settings(values: dict, **deployment: object):
    """Return run settings for a benchmark, which plays both the deployer and the user.

    ``output_root`` and any other deployment setting go in ``deployment``; every local path is
    allowed and the run's model is the one allowed model.
    """
    from include.settings import DeploymentSettings, RunSettings

    model = values.get("model_path", "Qwen/Qwen3.6-27B")
    # No catalogue: a benchmark names its own sources with their paths.
    dep = DeploymentSettings(**{"data_roots": ["/"], "allowed_models": [model],
                                "sglang_conn_id": "bench_no_key", "source_catalogue": {},
                                **deployment})
    return RunSettings.from_mapping(values, dep)


class TreeMemory(threading.Thread):
    """Sample, every ``interval`` s, the resident memory of process trees by name.

    ``peaks()`` gives per name the largest single process and the largest sum over the tree
    (a component and every task process it started), in MiB.
    """

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.roots: dict[str, list[int]] = {}
        self.peak_one: dict[str, float] = {}
        self.peak_sum: dict[str, float] = {}
        self.stop_event = threading.Event()

    def watch(self, name: str, pid: int | None) -> None:
        """Add the tree of ``pid`` under ``name`` (several trees may share a name)."""
        if pid and pid not in self.roots.setdefault(name, []):
            self.roots[name].append(pid)

    def sample(self) -> None:
        import psutil

        for name, pids in list(self.roots.items()):
            sizes = []
            for pid in pids:
                try:
                    root = psutil.Process(pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                for proc in procs:
                    try:
                        sizes.append(proc.memory_info().rss / 2**20)
                    except psutil.Error:
                        pass
            if sizes:
                self.peak_one[name] = max(self.peak_one.get(name, 0.0), max(sizes))
                self.peak_sum[name] = max(self.peak_sum.get(name, 0.0), sum(sizes))

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.sample()

    def peaks(self) -> dict[str, dict[str, float]]:
        return {name: {"process": round(self.peak_one[name], 1),
                       "tree": round(self.peak_sum[name], 1)} for name in sorted(self.peak_one)}

    def __enter__(self) -> TreeMemory:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.join()
