"""Prompts, engine configurations and checks the engine's integration tests share."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from include.engine.dispatch import EngineConfig
from include.engine.window import parse_metrics
from include.generation.shard import build_shard_output
from include.layout import shard_key
from include.prompts.encoding import encode_record
from include.storage import LocalStore
from include.target_tokenizer import count_prompt_tokens, load_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def make_prompts(n: int, words: int = 12, prefix: str = "p") -> list[dict]:
    """Return ``n`` prompt records with ids ``<prefix>:<i>``."""
    return [
        {"id": f"{prefix}:{i}", "source": "test", "metadata": {},
         "messages": [{"role": "user", "content": f"Question {i}: " + "explain this " * words}]}
        for i in range(n)
    ]


def chat_prompt(i: int) -> dict:
    """Return a whole-conversation prompt (``turns: all``): three user turns of chat ``i``."""
    messages = []
    for k in range(3):
        messages += [{"role": "user", "content": f"Chat {i} question {k}: explain this."},
                     {"role": "assistant", "content": "original answer"}]
    return {"id": f"chat:{i}", "source": "chat", "metadata": {}, "messages": messages,
            "turns": "all", "call_format": "tool_call"}


def engine_config(**overrides) -> EngineConfig:
    """Return a small, time-compressed engine configuration (cool-downs in tenths of s)."""
    values = dict(model="test-model", context_length=4096, max_tokens=256, context_margin=16,
                  min_completion_tokens=16, sampling={"temperature": 0.6, "top_p": 0.95,
                                                       "top_k": 20, "enable_thinking": True},
                  concurrency_mode="fixed", in_flight_per_server=8, request_timeout_s=30,
                  health_interval_s=0.3, progress_interval_s=1.0, max_attempts=4,
                  backoff_base_s=0.05, backoff_max_s=0.5, all_down_timeout_s=20,
                  cool_down_s=0.2, cool_down_max_s=1.0)
    values.update(overrides)
    return EngineConfig(**values)


def token_counter(tokenizer_dir):
    """Return the prompt-token counter of the stand-ins' tokenizer."""
    tok = load_tokenizer(str(tokenizer_dir))
    return lambda convs: count_prompt_tokens(tok, convs, True)


def generated_requests(url: str) -> int:
    """Return how many requests a stand-in has generated to the end, by its own counter.

    The stand-in counts ``sglang:num_requests_total`` only for a request it answered, not for
    one its client went away from. SGLang 0.5.23 increments it in
    ``observe_one_finished_request`` (``observability/metrics_collector.py``), which an
    aborted request can reach too: for the stand-in's faults only."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        return int(parse_metrics(answer.read().decode())["sglang:num_requests_total"])


def assert_accounted(prompts, outcome_records) -> dict:
    """Check every prompt is in the shard output exactly once; return its manifest."""
    ids = [p["id"] for p in prompts]
    assert sorted(outcome_records) == sorted(ids)
    data, manifest = build_shard_output("shard-00000", prompts, outcome_records)
    out_ids = [json.loads(line)["id"] for line in data.splitlines()]
    assert len(out_ids) == len(set(out_ids)), "a prompt is in the output twice"
    assert manifest["counts"]["completed"] == len(out_ids)
    assert sum(manifest["counts"].values()) == len(prompts)
    return manifest


def write_shard(store: LocalStore, prompts: list[dict]) -> None:
    """Write ``prompts`` as prompt shard 0 of the run in ``store``."""
    store.write_new(shard_key(0), b"".join(encode_record(p) for p in prompts))
