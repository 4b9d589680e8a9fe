"""A named prompt set's requests are journaled like the split's and reported as rows of their
own, labelled as the deployment's set: never pooled into "(all)", the gate or the speedup."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from include.evaluation.outcome import build
from include.evaluation.prompt_sets import read_prompt_set
from include.evaluation.records import TARGET_ONLY, Condition, record_from_answer
from include.evaluation.report import NAMED_SETS, card_section, markdown
from include.evaluation.settings import EvaluationRequest
from include.evaluation.stats import ALL_SOURCES, acceptance, differences, speedups
from include.sglang.contract import Answer
from include.storage.store import LocalStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompt_sets"


def _records(config: str, length: float, prompts: list[dict], rng: np.random.Generator,
             thinking: bool = True) -> list[dict]:
    out = []
    for p in prompts:
        verify = int(rng.integers(20, 40))
        tokens = int(round(verify * length))
        spec = None if config == TARGET_ONLY else {
            "spec_verify_ct": verify, "spec_num_correct_drafts": tokens - verify,
            "spec_num_proposed_drafts": verify * 3, "spec_accept_length": length}
        body = {"choices": [{"finish_reason": "stop"}], "usage": {"completion_tokens": tokens},
                "sglext": {"spec_tokens_details": spec}}
        out.append(record_from_answer(p, Condition(config, 0.0, thinking),
                                      Answer(200, json.dumps(body).encode()), tokens * 0.01))
    return out


def _split(n: int) -> list[dict]:
    return [{"id": f"math-{i}", "source": "math", "messages": []} for i in range(n)]


def test_a_set_s_rows_are_its_own_and_stay_out_of_the_pooled_figures() -> None:
    rng = np.random.default_rng(5)
    gsm8k = read_prompt_set("gsm8k", str(FIXTURES / "gsm8k_test.jsonl")).prompts
    # On the run's split the candidate is far better; on the named set it is far worse: a set
    # pooled into "(all)" would pull the candidate's pooled gain down.
    records = (_records("good", 3.0, _split(40), rng) + _records("good", 1.2, gsm8k, rng)
               + _records("poor", 2.0, _split(40), rng) + _records("poor", 2.9, gsm8k, rng)
               + _records(TARGET_ONLY, 1.0, _split(40) + gsm8k, rng))
    assert {r["prompt_set"] for r in records if "prompt_set" in r} == {"gsm8k"}
    assert records[40]["id"] == "good|t=0|think|set:gsm8k/line-1"
    figures = {(f.config, f.source): f for f in acceptance(records, seed=1)}
    assert figures[("good", ALL_SOURCES)].requests == 40
    assert figures[("good", "set:gsm8k")].requests == 3
    assert figures[("good", ALL_SOURCES)].accept_length.contains(3.0)
    diffs = {d.source: d for d in differences(records, "poor", ["good"], seed=1)}
    assert diffs[ALL_SOURCES].pairs == 40 and diffs[ALL_SOURCES].value.value > 0.9
    assert diffs["set:gsm8k"].pairs == 3 and diffs["set:gsm8k"].value.value < -1.0
    assert all(s.pairs == 40 for s in speedups(records, ["good"], seed=1))

    page = markdown("demo", list(figures.values()), list(diffs.values()), [])
    run_part, set_part = page.split("## Acceptance on the deployment's named prompt sets "
                                    "(not this run's data)")
    assert "set:gsm8k" not in run_part.split("## Candidates")[0]
    assert NAMED_SETS in set_part and "| good | set:gsm8k (named set) | on |" in set_part
    section = card_section("demo", "run-1", list(figures.values()), list(diffs.values()))
    pooled, named = section.split("On the deployment's named prompt sets")
    assert "set:gsm8k" not in pooled and "`good` on set:gsm8k, thinking on" in named


def test_report_json_counts_each_set_and_the_gate_sees_the_split_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    mtb = read_prompt_set("mt_bench", str(FIXTURES / "mt_bench_question.jsonl")).prompts
    records = (_records("good", 3.0, _split(30) + mtb, rng)
               + _records("poor", 2.0, _split(30) + mtb, rng))
    request = EvaluationRequest(baseline="poor", candidates=["good"], prompt_sets=["mt_bench"],
                                target_only_pass=False)
    data = build(LocalStore(tmp_path), {r["id"]: r for r in records}, request, "demo",
                 "run-1").data
    assert data["prompt_sets"] == {"mt_bench": 3}
    assert data["settings"]["prompt_sets"] == ["mt_bench"]
    assert [g["pairs"] for g in data["gains"]] == [30]
    assert {f["source"] for f in data["figures"]} == {"math", ALL_SOURCES, "set:mt_bench"}
