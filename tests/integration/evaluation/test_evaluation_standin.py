"""Issue 36's "done when", on stand-ins: two drafters of different fit, measured on a held-out
split through the evaluation's own client and journal, are ranked right, and each per-source
acceptance rate's interval holds the rate their configured fit implies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from include.durability.journal import FileJournal
from include.evaluation.measure import run_pass
from include.evaluation.records import TARGET_ONLY, Condition, completed
from include.evaluation.report import markdown
from include.evaluation.split import load_split
from include.evaluation.stats import ALL_SOURCES, acceptance, differences, speedups
from include.storage.store import LocalStore
from sglang_standin.testing import ThreadServer
from sglang_standin.tokenizer import build_chat_tokenizer
from tests.unit.evaluation.helpers import prompt, write_split

#: Per-position acceptance per source: the drafters' configured fit.
FITS = {"good": {"algebra": 0.8, "python": 0.6}, "poor": {"algebra": 0.45, "python": 0.3}}
DRAFT_TOKENS = 4  # EAGLE3's automatic (3, 1, 4): 3 proposed per verify


def _expected_rate(alpha: float, proposed: int = DRAFT_TOKENS - 1) -> float:
    return sum(alpha**i for i in range(1, proposed + 1)) / proposed


def _drafter(root: Path, name: str) -> str:
    path = root / name
    path.mkdir()
    rules = [{"match": [source], "rate": rate} for source, rate in FITS[name].items()]
    (path / "config.json").write_text(json.dumps(
        {"standin_acceptance": {"default": 0.5, "rules": rules}}))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from transformers import AutoTokenizer

    path = build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small")
    return AutoTokenizer.from_pretrained(path, local_files_only=True), path


def test_two_drafters_are_ranked_and_each_source_holds_its_fit(
        tmp_path: Path, tokenizer_pair: tuple[Any, Path]) -> None:
    tokenizer, tok_dir = tokenizer_pair
    run = tmp_path / "demo-run"
    write_split(run, [prompt(i, s, f"an {s} question number {i}")
                      for s in ("algebra", "python") for i in range(40)])
    split = load_split(LocalStore(run))
    # Long answers: each answer's last verify step is cut to the tokens it still needs
    # (sglang_standin/speculative.py), which pulls a short answer's rate below the fit.
    fast = {"standin_warmup_seconds": 0.05, "standin_zero_latency": True,
            "standin_median_output_tokens": 1500}
    servers = {name: ThreadServer.start(
        tokenizer, tok_dir, True, speculative_algorithm="EAGLE3",
        speculative_draft_model_path=_drafter(tmp_path, name), **fast) for name in FITS}
    servers[TARGET_ONLY] = ThreadServer.start(tokenizer, tok_dir, True, **fast)
    journal = FileJournal(tmp_path / "journal.jsonl")
    try:
        for name, server in servers.items():
            counts = run_pass([server.url], split.prompts, Condition(name, 0.0, False), journal,
                              model="m", max_tokens=6000)
            assert counts["completed"] == 80
        # A retried pass sends nothing again.
        again = run_pass([servers["good"].url], split.prompts, Condition("good", 0.0, False),
                         journal, model="m", max_tokens=6000)
        assert again == {"resumed": 80}
    finally:
        journal.close()
        for server in servers.values():
            server.close()
    records = completed(FileJournal(tmp_path / "journal.jsonl").load())
    assert len(records) == 240
    figures = {(f.config, f.source): f for f in acceptance(records, seed=0)}
    # Each figure against its fit at 99.9%: four checks at 95% would miss one run in five by
    # chance (the stand-in's draws follow the drafter's temporary path, so each run differs).
    wide = {(f.config, f.source): f for f in acceptance(records, seed=0, level=0.999)}
    for name, fit in FITS.items():
        for source, alpha in fit.items():
            rate = wide[(name, source)].accept_rate
            assert rate.contains(_expected_rate(alpha)), (name, source, rate, alpha)
    assert (figures[("good", ALL_SOURCES)].accept_length.low
            > figures[("poor", ALL_SOURCES)].accept_length.high)
    diff = [d for d in differences(records, "poor", ["good"], seed=0)
            if d.source == ALL_SOURCES][0]
    assert diff.pairs == 80 and diff.value.low > 0
    speed = speedups(records, ["good", "poor"], seed=0)
    assert [s.pairs for s in speed] == [80, 80]
    page = markdown("demo-run", list(figures.values()), [diff], speed)
    assert "| good | algebra | off | 0 | 40 |" in page
