"""Per-request records (journaled, resumable), the statistics and the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from include.durability.journal import FileJournal
from include.evaluation.records import TARGET_ONLY, Condition, completed, record_from_answer
from include.evaluation.report import DEFINITIONS, card_section, markdown, plot_png
from include.evaluation.stats import ALL_SOURCES, acceptance, differences, speedups
from include.sglang.contract import Answer

COND = Condition("eagle-a", 0.0, True)
SPEC = {"spec_accept_rate": 0.5, "spec_accept_length": 2.5, "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 30,
        "spec_num_proposed_drafts": 60, "spec_verify_ct": 20,
        "spec_correct_drafts_histogram": [5, 10, 5], "spec_cap_lens_histogram": []}


def _answer(spec: dict | None = SPEC, tokens: int = 51) -> Answer:
    body: dict = {"choices": [{"finish_reason": "stop"}],
                  "usage": {"completion_tokens": tokens}}
    if spec is not None:
        body["sglext"] = {"spec_tokens_details": spec}
    return Answer(200, json.dumps(body).encode())


def test_a_record_keeps_the_servers_figures() -> None:
    prompt = {"id": "p1", "source": "math", "messages": []}
    record = record_from_answer(prompt, COND, _answer(), 0.25)
    assert record["id"] == "eagle-a|t=0|think|p1" and record["status"] == "completed"
    assert record["spec"]["verify_ct"] == 20 and record["spec"]["accept_length"] == 2.5
    assert record["completion_tokens"] == 51 and record["latency_s"] == 0.25
    assert record_from_answer(prompt, COND, _answer(None), 0.1)["spec"] is None


def test_a_retryable_failure_is_redone_and_a_completed_request_is_not(tmp_path: Path) -> None:
    prompt = {"id": "p1", "source": "math", "messages": []}
    journal = FileJournal(tmp_path / "j.jsonl")
    journal.append(record_from_answer(prompt, COND, Answer(503, b"full"), 0.1))
    journal.append(record_from_answer(prompt, COND, _answer(), 0.2))
    journal.append(record_from_answer(prompt, COND, _answer(tokens=99), 0.3))
    journal.close()
    records = FileJournal(tmp_path / "j.jsonl").load()
    assert [r["completion_tokens"] for r in completed(records)] == [51]


def _synthetic(config: str, alpha_len: float, n: int, rng: np.random.Generator,
               source: str = "math", latency_per_token: float = 0.01) -> list[dict]:
    out = []
    for i in range(n):
        verify = int(rng.integers(20, 40))
        tokens = int(round(verify * alpha_len + rng.normal(0, 2)))
        spec = None if config == TARGET_ONLY else {
            "verify_ct": verify, "num_correct_drafts": tokens - 1 - verify,
            "num_proposed_drafts": verify * 3}
        out.append({"config": config, "source": source, "thinking": True, "temperature": 0.0,
                    "prompt_id": f"p{i}", "completion_tokens": tokens, "spec": spec,
                    "latency_s": tokens * latency_per_token})
    return out


def test_intervals_contain_the_truth_and_rank_the_drafters() -> None:
    rng = np.random.default_rng(3)
    records = (_synthetic("good", 3.0, 200, rng) + _synthetic("poor", 2.0, 200, rng)
               + _synthetic(TARGET_ONLY, 3.0, 200, rng, latency_per_token=0.03))
    figures = {(f.config, f.source): f for f in acceptance(records, seed=1)}
    assert figures[("good", ALL_SOURCES)].accept_length.contains(3.0)
    assert figures[("poor", "math")].accept_length.contains(2.0)
    assert figures[("good", "math")].requests == 200
    diff = [d for d in differences(records, "poor", ["good"], seed=1)
            if d.source == ALL_SOURCES][0]
    assert diff.pairs == 200 and diff.value.low > 0.8 and diff.value.contains(1.0)
    speed = speedups(records, ["good"], seed=1)[0]
    assert speed.value.contains(3.0)
    # Seeded: the same records give the same intervals.
    assert acceptance(records, seed=1) == acceptance(records, seed=1)


def test_the_report_states_the_definition_and_draws_the_plot() -> None:
    rng = np.random.default_rng(4)
    records = _synthetic("good", 3.0, 30, rng) + _synthetic("poor", 2.0, 30, rng, "code")
    figures = acceptance(records, seed=0, n_boot=200)
    diffs = differences(records, "poor", ["good"], seed=0, n_boot=200)
    page = markdown("demo", figures, diffs, [], "acceptance.png")
    assert DEFINITIONS in page and "counting the bonus token" in page
    assert "| good | math | on | 0 | 30 |" in page
    card = card_section("demo", "eval-1", figures, diffs)
    assert card.startswith("## Measured value (eval-1)") and "`good`" in card
    assert plot_png(figures)[:8] == b"\x89PNG\r\n\x1a\n"
