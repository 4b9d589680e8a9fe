"""Build a small real run with the stages' own functions against stand-in servers.

Prompts from the bundled sample sources, generation through the real engine (journals,
retries, budgets, truncation), publishing and tokenization exactly as the DAG's tasks do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from include.generation.shard import generate_shard, publish_shard
from include.pipeline.binding import open_run_store
from include.prompts.plan import prepare_or_reuse
from include.settings import RunSettings
from include.tokenization.stage import tokenize_run_shard
from sglang_standin.process import StandinProcess
from tests.fixtures.settings import run_settings as bound_settings

CONTEXT_LENGTH = 800
#: Short answers capped low so some are truncated; 500s on 8% of requests so some prompts are
#: retried and a few fail; the short context makes the longest prompts skipped.
STANDIN_FLAGS: dict[str, Any] = {
    "standin_warmup_seconds": 0.05, "standin_time_scale": 0.005,
    "standin_median_output_tokens": 150, "enable_metrics": True,
    "context_length": CONTEXT_LENGTH, "served_model_name": "Qwen/Qwen3.6-27B",
    "standin_error_rate": 0.08,
    # As the DAG launches servers (reasoning_parser setting); without it every completion
    # keeps its <think> block in `content` and is quarantined as template_mismatch.
    "reasoning_parser": "qwen3",
}


def start_servers(tokenizer_dir: Path, n: int = 2) -> list[StandinProcess]:
    """Start ``n`` stand-in servers and wait until they are healthy."""
    procs = [StandinProcess(tokenizer_dir, **STANDIN_FLAGS) for _ in range(n)]
    for p in procs:
        p.start(wait=False)
    for p in procs:
        p.wait_healthy(timeout=60)
    return procs


def run_settings(output_root: Path, tokenizer_dir: Path, **overrides: Any) -> RunSettings:
    """Return the settings of the small run under ``output_root`` (``overrides``: run settings)."""
    return bound_settings({
        "run_name": "small", "shard_size": 100,
        "model_path": str(tokenizer_dir), "served_model_name": "Qwen/Qwen3.6-27B",
        "context_length": CONTEXT_LENGTH, "max_tokens": 300, "min_completion_tokens": 64,
        "max_attempts": 2, "progress_interval_s": 5, "health_interval_s": 1, **overrides,
    }, output_root=str(output_root))


def build_run(settings: RunSettings, urls: list[str], finish: int | None = None,
              generate_only: int = 0) -> tuple[list[str], list[dict[str, Any]]]:
    """Prepare the run, fully run its first ``finish`` shards (all by default) and only
    generate the next ``generate_only`` (journal, no manifests: a shard "running").

    Returns the shard ids fully run and the generate tasks' results.
    """
    manifest = prepare_or_reuse(settings, open_run_store(settings))
    ids = [s["shard_id"] for s in manifest["shards"] if s["count"]]
    finish = len(ids) if finish is None else finish
    store = open_run_store(settings)
    results = []
    for sid in ids[:finish]:
        results.append(generate_shard(settings, sid, urls, store, store))
        publish_shard(sid, store)
        tokenize_run_shard(settings, sid, store)
    for sid in ids[finish:finish + generate_only]:
        generate_shard(settings, sid, urls, store, store)
    return ids[:finish], results
