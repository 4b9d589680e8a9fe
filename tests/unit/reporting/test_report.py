"""The report from a synthetic run: figures, gates, files, create-only retries."""

from __future__ import annotations

import json

import pytest

from include.layout import report_prefix
from include.reporting import QualityGateError, QualityGates, build_report, raise_for_gates
from tests.unit.reporting.synthetic_run import ShardSpec, write_run

SHARDS = {
    "shard-00000": ShardSpec(completed=20, truncated=2, skipped=1, failed=1, quarantined=1,
                             retried=3),
    "shard-00001": ShardSpec(completed=30, truncated=6, quarantined=0),
    "shard-00002": ShardSpec(completed=10, truncated=0, sources=("alpha", "beta", "gamma")),
}
LOOSE = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0, max_quarantine_rate=1.0)


def _report(store, settings, gates=LOOSE, run_id="r1", plots=False, reused=()):
    summary = build_report(settings, store, store, [s for s in SHARDS if s not in reused],
                           list(reused), run_id=run_id, gates=gates, plots=plots)
    full = json.loads(store.read(report_prefix(run_id) + "report.json"))
    return summary, full


def test_funnel_tokens_and_retries_match_what_was_written(store, settings) -> None:
    write_run(store, SHARDS)
    summary, r = _report(store, settings)
    assert summary["generation"] == {"prompts": 62, "completed": 60, "skipped": 1, "failed": 1,
                                     "truncated": 8}
    gen = r["funnel"]["generation"]
    assert gen["gamma"]["completed"] == 3 and gen["alpha"]["completed"] == 29
    assert sum(v["completed"] for v in gen.values()) == 60
    # Prompt 20 of shard 0 (alpha) was skipped, prompt 21 (beta) failed.
    assert gen["alpha"]["skipped_by_reason"] == {"prompt_too_long": 1}
    assert gen["beta"]["skipped_by_reason"] == {}
    assert gen["beta"]["failed_by_reason"] == {"http_500": 1}
    assert gen["beta"]["sent"] == gen["beta"]["completed"] + 1
    assert gen["alpha"]["prompts"] == gen["alpha"]["completed"] + 1
    assert r["funnel"]["prepare"]["alpha"]["dropped"] == {"empty": 2}
    tok = r["tokenization"]["totals"]
    assert (tok["input"], tok["written"], tok["quarantined"]) == (60, 59, 1)
    assert tok["quarantined_by_reason"] == {"decode_mismatch": 1}
    assert r["throughput"]["retries"] == {"extra_attempts": 3 + 3 * 1, "prompts_retried": 4}
    assert r["tokens"]["completion_tokens"] == sum(
        100 + i for spec in SHARDS.values() for i in range(spec.completed))
    assert all(c["ok"] for c in r["consistency"])
    assert set(r["sources_of_truth"]) >= {"funnel.prepare", "throughput, drains, retries"}
    assert r["passed"] and summary["passed"]


def test_each_gate_fails_just_over_and_passes_at_its_threshold(store, settings) -> None:
    write_run(store, SHARDS)
    # Measured: truncation 8/60, failure 1/61 (sent), quarantine 1/60, fewest per source 3.
    cases = {
        "max_truncation_rate": (8 / 60, "shard-00001"),
        "max_failure_rate": (1 / 61, "shard-00000"),
        "max_quarantine_rate": (1 / 60, "shard-00000"),
    }
    for i, (name, (value, worst)) in enumerate(cases.items()):
        ok = QualityGates(**{**LOOSE.__dict__, name: value})
        assert _report(store, settings, ok, run_id=f"ok{i}")[0]["passed"], name
        bad = QualityGates(**{**LOOSE.__dict__, name: value * 0.999})
        summary, full = _report(store, settings, bad, run_id=f"bad{i}")
        assert not summary["passed"] and not full["passed"]
        with pytest.raises(QualityGateError) as err:
            raise_for_gates(summary)
        msg = str(err.value)
        assert name in msg and f"{value:.4g}" in msg and worst in msg, msg
    ok = QualityGates(**{**LOOSE.__dict__, "min_completions_per_source": 3})
    assert _report(store, settings, ok, run_id="ok-min")[0]["passed"]
    bad = QualityGates(**{**LOOSE.__dict__, "min_completions_per_source": 4})
    summary, _ = _report(store, settings, bad, run_id="bad-min")
    with pytest.raises(QualityGateError, match=r"min_completions_per_source: measured 3.*gamma"):
        raise_for_gates(summary)


def test_default_gates_fail_this_run_on_truncation_and_failures(store, settings) -> None:
    write_run(store, SHARDS)
    summary, _ = _report(store, settings, QualityGates(max_truncation_rate=0.1))
    failed = {g["name"] for g in summary["gates"] if not g["passed"]}
    assert failed == {"max_truncation_rate", "max_failure_rate", "max_quarantine_rate"}


def test_files_are_create_only_and_a_retry_rewrites_identical_bytes(store, settings) -> None:
    write_run(store, SHARDS)
    _report(store, settings, plots=True)
    prefix = report_prefix("r1")
    files = {k: store.read(k) for k in store.list(prefix)}
    assert {k[len(prefix):] for k in files} == {
        "report.json", "report.md", "report.html", "throughput.png", "prompt_tokens.png",
        "completion_tokens.png", "tokenized_length.png", "README.md"}
    assert files[prefix + "throughput.png"].startswith(b"\x89PNG")
    _report(store, settings, plots=True)  # a retried task: same inputs, same bytes
    assert {k: store.read(k) for k in store.list(prefix)} == files
    md = files[prefix + "report.md"].decode()
    assert "| alpha |" in md and "max_truncation_rate" in md


def test_backfill_lists_produced_and_reused_and_times_only_produced(store, settings) -> None:
    write_run(store, SHARDS)
    _, r = _report(store, settings, reused=("shard-00000", "shard-00001"))
    assert r["shards"]["produced"] == ["shard-00002"]
    assert r["shards"]["reused"] == ["shard-00000", "shard-00001"]
    assert r["throughput"]["output_tokens"] == sum(100 + i for i in range(10))
    assert r["generation"]["totals"]["completed"] == 60  # the dataset covers all shards


def test_a_shard_without_outputs_fails_the_run(store, settings) -> None:
    shards = {**SHARDS, "shard-00003": ShardSpec(completed=5, journal_only=True)}
    write_run(store, shards)
    summary = build_report(settings, store, store, list(shards), [], run_id="x", gates=LOOSE,
                           plots=False)
    with pytest.raises(QualityGateError, match="all_shards_complete.*shard-00003"):
        raise_for_gates(summary)


def test_throughput_drains_and_servers(store, settings) -> None:
    write_run(store, {"shard-00000": ShardSpec(completed=10)})
    _, r = _report(store, settings)
    tp = r["throughput"]
    # Requests start at T0 - 1 (finished_at T0+1+i, latency 2) and end at T0 + 10.
    assert tp["wall_s"] == pytest.approx(11.0)
    assert tp["output_tokens"] == sum(100 + i for i in range(10))
    assert sum(p["output_tokens_per_s"] * p["width_s"] for p in tp["timeline"]) == (
        pytest.approx(tp["output_tokens"], rel=1e-3))
    assert set(tp["per_server"]) == {"http://s0:1", "http://s1:1"}
    assert tp["per_server"]["http://s0:1"]["idle_tail_s"] == pytest.approx(1.0)
    assert tp["drains"]["run_drain_s"] == pytest.approx(2.0)
    assert r["servers"] == {"models": ["m"], "context_length": settings.context_length,
                            "context_length_from": "settings", "ejections": None,
                            "versions": [{"url": f"http://s{i}:1", "model": "m",
                                          "version": None, "weight_version": None}
                                         for i in (0, 1)]}
    assert tp["no_request_in_flight"] == []  # requests overlap end to end


def test_time_with_no_request_in_flight_is_marked_apart_from_idle_servers() -> None:
    from types import SimpleNamespace

    from include.reporting.throughput import idle_gaps

    def c(start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(finished_at=end, latency_s=end - start)

    # Two shards with a 5 s gap between them, and one short blip under the 0.5 s floor.
    comps = [c(0, 4), c(1, 6), c(11, 15), c(15.2, 16)]
    assert idle_gaps(comps, start=0.0) == [{"from_s": 6.0, "to_s": 11.0}]


def test_gate_lines_are_worded_for_their_direction() -> None:
    from include.reporting.gates import GateResult

    off = GateResult("min_completions_per_source", 0, 0, True, None, None)
    assert off.message == "ok min_completions_per_source: measured 0, no minimum set"
    short = GateResult("min_completions_per_source", 5, 3, False, None, None,
                       [{"name": "gamma", "count": 3}])
    assert short.message == ("FAILED min_completions_per_source: measured 3, at least 5 "
                             "required; short: gamma: 3")
    cap = GateResult("max_truncation_rate", 0.2, 0.05, True, 1, 20)
    assert cap.message == "ok max_truncation_rate: measured 0.05 (1/20), at most 0.2 allowed"


def test_a_conversations_later_turns_are_no_retries() -> None:
    """Issue 34, item 5: under turns: all a conversation's attempts are its turns' sum; the
    report counted turns 2..n as retries ("68 extra attempts", every shard log 0 retries)."""
    from include.reporting.facts import completion

    def conversation(attempts_per_turn: list[int]) -> dict:
        return {"id": "c:0", "source": "c", "finish_reason": "stop",
                "turn_results": [{"usage": {"completion_tokens": 5}}] * len(attempts_per_turn),
                "timings": {"attempts": sum(attempts_per_turn), "finished_at": 10.0}}

    assert completion(conversation([1, 1, 1])).attempts == 1  # three requests, no retry
    assert completion(conversation([1, 2, 1])).attempts == 2  # one retry
    single = {"id": "s:0", "finish_reason": "stop", "timings": {"attempts": 3}}
    assert completion(single).attempts == 3


def test_tokens_per_s_is_the_monitors_figure_and_name() -> None:
    """Issue 34, item 5: the report divided by the run's wall clock, the monitor by the time
    shards were generating; with gaps between short shards they differed by ~60%."""
    from include.monitor import page
    from include.reporting import render
    from include.reporting.collect import ShardFacts
    from include.reporting.facts import Completion
    from include.reporting.throughput import generation_average, generation_span, throughput

    def shard(sid: str, start: float, manifest: bool) -> ShardFacts:
        # 10 s of requests, 100 tokens a second, then a 15 s gap before the next shard; the
        # generate call itself ran 2 s longer (its start-up), as its manifest records.
        comps = [Completion("a", "stop", 10, 100, "s1", "m", start + i + 1, 1.0, 1)
                 for i in range(10)]
        generated = {"generation": {"started_at": start - 2, "finished_at": start + 10,
                                    "output_tokens": 1000}} if manifest else None
        return ShardFacts(sid, reused=False, generated=generated, completions=comps)

    produced = [shard("shard-00000", 0.0, True), shard("shard-00001", 25.0, True)]
    tp = throughput(produced)
    # The monitor's function over the monitor's spans (the generated manifests'), not the
    # wall clock (35 s, 57 tokens/s): the same figure on both pages.
    spans = [generation_span(s.generated) for s in produced]
    from include.monitor import runs

    assert runs.generation_average is generation_average  # one function, not a copy
    assert tp["wall_s"] == 35.0 and tp["generating_s"] == 24.0
    assert tp["output_tokens_per_s"] == round(2000 / 24, 1) == round(
        generation_average(spans), 1)  # rounded as the monitor rounds it
    assert render.TOKENS_PER_S == page.TOKENS_PER_S
    # Manifests from before the spans: the completions' own windows, still not the wall.
    older = throughput([shard("shard-00000", 0.0, False), shard("shard-00001", 25.0, False)])
    assert older["output_tokens_per_s"] == 100.0


def test_the_report_page_links_its_card_explains_its_gates_and_follows_dark_mode(
        store, settings) -> None:
    """Issue 34, items 4 and 8."""
    write_run(store, SHARDS)
    _report(store, settings)
    html = store.read(report_prefix("r1") + "report.html").decode()
    assert "<a href='README.md'>README.md</a>" in html  # the card, beside this file
    assert "<a href='README.md'>dataset card</a>" in html
    assert store.exists(report_prefix("r1") + "README.md")  # what the links open
    assert ":root{color-scheme:light dark}" in html and "prefers-color-scheme:dark" in html
    row = html[html.index("<td>all_shards_complete</td>"):]
    row = row[:row.index("</tr>")]
    assert row == ("<td>all_shards_complete</td><td>shards of the run with no generated or "
                   "tokenized output</td><td>0</td><td>at most 0</td><td>pass</td><td>-</td>")
    assert "<td>0.13 (8/60)</td><td>at most 1.00</td>" in html  # truncation: 8 of 60
