"""Mixed sampling through the engine: each prompt sent with its variant, recorded per row."""

from __future__ import annotations

import collections
import logging

import pytest

from include.durability.journal import FileJournal
from include.engine.dispatch import run_shard
from include.engine.variants import variant_of
from include.target_tokenizer import count_prompt_tokens, load_tokenizer
from tests.integration.generation.helpers import assert_accounted, engine_config, make_prompts

pytestmark = pytest.mark.integration

MIX = {"temperature": [0.6, 1.0], "enable_thinking": [True, False]}


def test_each_prompt_goes_out_with_its_variant_and_thinking_off_is_budgeted_as_rendered(
    standins, tokenizer_dir, tmp_path, caplog
) -> None:
    servers = standins(1, context_length=2048, reasoning_parser="qwen3")
    tok = load_tokenizer(str(tokenizer_dir))
    sent: collections.Counter[bool] = collections.Counter()

    def counter(convs, enable_thinking=True):
        sent[enable_thinking] += len(convs)
        return count_prompt_tokens(tok, convs, enable_thinking)

    prompts = make_prompts(60, words=40)
    # Budgets at the edge: a count off by the empty think block would be answered with a 400.
    cfg = engine_config(context_length=2048, max_tokens=4096, min_completion_tokens=64,
                        context_margin=2, sampling_variants=MIX, seed=3)
    with caplog.at_level(logging.WARNING):
        outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                            FileJournal(tmp_path / "j.jsonl"), cfg, counter)
    assert_accounted(prompts, outcome.records)
    assert "server counted" not in caplog.text
    assert sent[True] and sent[False]
    seen = collections.Counter()
    for p in prompts:
        rec = outcome.records[p["id"]]
        want = variant_of(p["id"], 3, MIX)
        assert {k: rec["sampling"][k] for k in want} == want
        assert rec["sampling"]["variant"].startswith(f"temperature={want['temperature']}")
        thinks = "<think>" in (rec.get("text") or "")
        assert thinks == want["enable_thinking"], rec["id"]
        seen[rec["sampling"]["variant"]] += 1
        assert rec["server_version"] == "0.5.23"  # as the server's /server_info says
        assert rec["weight_version"] == "default"  # the answer's own metadata
        # The server's count of the think block's ids (a reasoning parser is configured).
        reasoning = rec["usage"]["reasoning_tokens"]
        assert (reasoning > 0) == want["enable_thinking"]
    assert len(seen) == 4
