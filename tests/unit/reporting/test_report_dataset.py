"""What the report says about the dataset: its card, the quality filters' gate, whole
conversations, and server time worded as the plot draws it."""

from __future__ import annotations

import html
import json
from collections import Counter

import pytest
import yaml

from include.layout import card_key, report_card_key
from include.reporting import QualityGateError, QualityGates, build_report, raise_for_gates
from include.reporting.plots import throughput_figure
from include.reporting.throughput import describe_server_time, server_time_shares
from include.tokenization.conversations import ShardConversations
from tests.unit.reporting.synthetic_run import ShardSpec, write_run

SHARDS = {
    "shard-00000": ShardSpec(completed=20, quarantined=1, extra={"server_version": "0.5.23"}),
    "shard-00001": ShardSpec(completed=30, extra={"server_version": "0.5.23"}),
    "shard-00002": ShardSpec(completed=10, sources=("alpha", "beta", "gamma")),
}
LOOSE = QualityGates(max_truncation_rate=1.0, max_failure_rate=1.0, max_quarantine_rate=1.0)


def _build(store, settings, shards=SHARDS, *, run_id="r1", gates=LOOSE, produced=None,
           reused=(), **kw):
    produced = list(shards) if produced is None else produced
    summary = build_report(settings, store, store, [s for s in produced if s not in reused],
                           list(reused), run_id=run_id, gates=gates, plots=False, **kw)
    return summary, json.loads(store.read(f"report/{run_id}/report.json"))


def _header(card: bytes) -> dict:
    text = card.decode()
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].split("\n---\n", 1)[0])


def _page(store, run_id="r1") -> str:
    return store.read(f"report/{run_id}/report.html").decode()


def test_the_card_is_written_beside_the_report_and_at_the_root_by_the_publishing_run(
        store, settings) -> None:
    write_run(store, SHARDS)
    summary, report = _build(store, settings, settings_fingerprint="fp-0123abcd")
    card = store.read(report_card_key("r1"))
    assert store.read(card_key()) == card
    rows = sum(json.loads(store.read(f"tokenized/{s}.manifest.json"))["counts"]["written"]
               for s in SHARDS)
    assert rows == 59
    assert _header(card)["dataset_info"]["splits"] == [{"name": "train", "num_examples": rows}]
    text = card.decode()
    assert "`fp-0123abcd`" in text and report["settings_fingerprint"] == "fp-0123abcd"
    # Server versions from the journal records reach the card's server table.
    assert "| http://s0:1 | m | 0.5.23 |" in text
    assert summary["dataset_card"]["root"] == "written by this run"
    # A retried report task rewrites the same bytes and succeeds.
    _build(store, settings, run_id="r1", settings_fingerprint="fp-0123abcd")
    # A later run over the complete dataset keeps the first card and says so.
    later, _ = _build(store, settings, run_id="r2", reused=tuple(SHARDS))
    assert store.read(card_key()) == card
    assert "r2" in store.read(report_card_key("r2")).decode()
    assert later["dataset_card"]["root"].startswith("kept")


@pytest.mark.parametrize("case", ["gates failed", "shards left out"])
def test_a_run_that_does_not_publish_the_whole_dataset_writes_no_root_card(
        store, settings, case) -> None:
    write_run(store, SHARDS)
    if case == "gates failed":
        summary, _ = _build(store, settings, gates=QualityGates(max_quarantine_rate=0.0))
        assert not summary["passed"]
    else:
        summary, _ = _build(store, settings, produced=["shard-00000"])
        assert summary["passed"]  # its own shards are fine; the dataset is not whole
    assert store.exists(report_card_key("r1"))
    assert not store.exists(card_key())
    assert summary["dataset_card"]["root"].startswith("not written")


FILTERED = {
    # Completions alternate alpha, beta: the first four are quarantined with these reasons.
    "shard-00000": ShardSpec(completed=20, quarantined=4, quarantine_reasons=(
        "degenerate_repetition", "degenerate_repetition", "empty_answer")),
    "shard-00001": ShardSpec(completed=40),
}


def test_quality_filters_have_their_own_gate_apart_from_pipeline_quarantines(
        store, settings) -> None:
    write_run(store, FILTERED)
    # 1 decode_mismatch in 60: under 0.02. Counted with the filters' 3 it would be 4/60.
    strict = QualityGates(**{**LOOSE.__dict__, "max_quarantine_rate": 0.02})
    summary, report = _build(store, settings, FILTERED, gates=strict)
    gates = {g["name"]: g for g in report["gates"]}
    assert (gates["max_quarantine_rate"]["numerator"],
            gates["max_quarantine_rate"]["denominator"]) == (1, 60)
    assert gates["max_filtered_rate"]["measured"] == pytest.approx(3 / 60)
    assert gates["max_filtered_rate"]["threshold"] == 0.05 and summary["passed"]
    qf = report["quality_filters"]
    assert qf["filters"]["degenerate_repetition"] == {"quarantined": 2, "off": False}
    assert qf["filters"]["empty_answer"]["quarantined"] == 1
    assert qf["per_source"] == {"alpha": {"degenerate_repetition": 1, "empty_answer": 1},
                                "beta": {"degenerate_repetition": 1}}
    page = _page(store)
    assert "<h2>Output quality filters</h2>" in page
    assert ("<tr><td>degenerate_repetition</td><td>on</td><td>2</td><td>1</td><td>1</td></tr>"
            in page)

    tight = QualityGates(**{**LOOSE.__dict__, "max_filtered_rate": 0.04})
    summary, _ = _build(store, settings, FILTERED, gates=tight, run_id="tight")
    with pytest.raises(QualityGateError) as err:
        raise_for_gates(summary)
    msg = str(err.value)
    assert "max_filtered_rate: measured 0.05 (3/60), at most 0.04 allowed" in msg, msg
    assert "degenerate_repetition 2, empty_answer 1" in msg and "shard-00000: 3" in msg
    assert "quality_filters_off: [degenerate_repetition]" in msg
    assert "max_quarantine_rate" not in msg


def _conversations() -> dict:
    found = ShardConversations(
        turns={f"alpha:default:c{i}": [f"t{i}-{k}" for k in range(n)]
               for i, n in enumerate((2, 3, 2, 3))},
        ends=Counter({"completed": 2, "tool_call_diverged": 1, "context_exhausted": 1}),
        whole_rows=1, turn_rows=6, kept_apart=Counter({"not_prefix_stable": 2, "one_turn": 1}),
        example="alpha:default:c1: turn 2's prompt ids differ at token 17")
    return found.manifest()


def test_whole_conversations_are_counted_and_each_checked_turn_counts_in_the_gates(
        store, settings) -> None:
    shards = {**SHARDS, "shard-00002": ShardSpec(completed=10, conversations=_conversations())}
    write_run(store, shards)
    _, report = _build(store, settings, shards)
    conv = report["conversations"]
    assert (conv["conversations"], conv["turns"], conv["whole_rows"], conv["turn_rows"]) == (
        4, 10, 1, 6)
    assert conv["ends"] == {"completed": 2, "tool_call_diverged": 1, "context_exhausted": 1,
                            "truncated": 0, "failed": 0}
    assert conv["kept_apart"] == {"not_prefix_stable": 2, "one_turn": 1}
    # A conversation is one generated record and one tokenizer input: the files agree.
    assert all(c["ok"] for c in report["consistency"]), report["consistency"]
    # Its turns are checked one by one: 60 records, 4 of them conversations of 10 turns.
    assert report["tokenization"]["totals"]["checked"] == 60 - 4 + 10
    gate = next(g for g in report["gates"] if g["name"] == "max_quarantine_rate")
    assert (gate["numerator"], gate["denominator"]) == (1, 66)
    page = _page(store)
    assert "<h2>Whole conversations</h2>" in page
    assert "4 conversations, 10 target turns; 7 rows from them: 1 whole-conversation" in page
    assert "<tr><td>tool_call_diverged</td><td>1</td></tr>" in page
    assert "<tr><td>failed</td><td>0</td></tr>" in page
    assert "turn 2&#x27;s prompt ids differ at token 17" in page


def test_a_run_without_conversations_shows_no_conversation_section(store, settings) -> None:
    write_run(store, SHARDS)
    _, report = _build(store, settings)
    assert report["conversations"] is None
    assert "Whole conversations" not in _page(store)


def test_the_throughput_text_gives_the_plots_server_time_shares(store, settings) -> None:
    # Three shards generated one after another (T0, T0 + 100, T0 + 200): time between tasks.
    write_run(store, SHARDS)
    _, report = _build(store, settings)
    tp = report["throughput"]
    shares = server_time_shares(tp)
    assert shares["between_tasks"] > 0.5 and shares["idle"] < 0.2
    page = _page(store)
    assert html.escape(describe_server_time(tp)) in page
    idle = f"{shares['idle']:.1%}"
    assert f"idle (nothing in flight while a shard was generating) {idle}" in page
    labels = [t.get_text() for ax in throughput_figure(tp).axes if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    assert f"idle (nothing in flight, a shard generating) {idle}" in labels
    # The drain sentence gives server-seconds, part of that idle time: no second share.
    assert "server-seconds for it (part of the idle time above)" in page
    assert "of server time)" not in page
    assert "throughput.server_time" in report["sources_of_truth"]


def test_the_settings_fingerprint_is_the_one_every_shard_recorded_or_none() -> None:
    from include.reporting.build import agreed_fingerprint
    from include.reporting.collect import ShardFacts

    def shard(fp: str | None) -> ShardFacts:
        generation = {"settings_fingerprint": fp} if fp else {}
        return ShardFacts("shard-00000", False, generated={"generation": generation})

    assert agreed_fingerprint([shard("a1"), shard("a1")]) == "a1"
    assert agreed_fingerprint([shard("a1"), shard("b2")]) is None
    assert agreed_fingerprint([shard("a1"), shard(None)]) is None
