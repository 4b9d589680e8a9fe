"""The throughput figures and plot from synthetic request timelines: one basis for text and plot."""

from __future__ import annotations

import pytest

from include.reporting.collect import ShardFacts
from include.reporting.facts import Completion
from include.reporting.plots import throughput_figure, throughput_plot
from include.reporting.throughput import describe_server_time, throughput

T0 = 1_800_000_000.0


def _c(server: str, start: float, end: float, tokens: int) -> Completion:
    return Completion(source="alpha", finish_reason="stop", prompt_tokens=10,
                      completion_tokens=tokens, server=server, model="m",
                      finished_at=T0 + end, latency_s=end - start, attempts=1)


def _shard(sid: str, *comps: Completion) -> ShardFacts:
    return ShardFacts(sid, reused=False, completions=list(comps))


#: Shard 0: s0 busy 0-10, s1 busy 0-6 (idle 6-10 while s0 works); 20 s with no shard
#: generating; shard 1: both busy 30-40.
TWO_SHARDS = [
    _shard("shard-00000", _c("s0", 0, 10, 1000), _c("s1", 0, 6, 600)),
    _shard("shard-00001", _c("s0", 30, 40, 500), _c("s1", 30, 40, 500)),
]


def test_busy_idle_and_between_tasks_add_up_to_server_time() -> None:
    st = throughput(TWO_SHARDS)["server_time"]
    assert (st["servers"], st["wall_s"], st["generating_s"]) == (2, 40.0, 20.0)
    assert (st["busy_server_s"], st["idle_server_s"], st["between_tasks_server_s"]) == (
        36.0, 4.0, 40.0)
    assert (st["busy_fraction"], st["idle_fraction"], st["between_tasks_fraction"]) == (
        0.45, 0.05, 0.5)
    assert st["between_tasks"] == [{"from_s": 10.0, "to_s": 30.0}]
    assert st["per_server"]["s1"] == {"busy_s": 16.0, "idle_s": 4.0, "between_tasks_s": 20.0}


def test_the_texts_idle_share_is_the_plots() -> None:
    tp = throughput(TWO_SHARDS)
    st = tp["server_time"]
    total = st["servers"] * st["wall_s"]
    # What the plot draws, bin by bin, adds up to the shares the text gives.
    plotted_idle = sum(p["idle_servers"] * p["width_s"] for p in tp["timeline"]) / total
    plotted_busy = sum(p["busy_servers"] * p["width_s"] for p in tp["timeline"]) / total
    assert plotted_idle == pytest.approx(st["idle_fraction"]) == pytest.approx(0.05)
    assert plotted_busy == pytest.approx(st["busy_fraction"])
    text = describe_server_time(tp)
    assert "busy (a request in flight) 45.0%" in text
    assert "idle (nothing in flight while a shard was generating) 5.0%" in text
    assert "1 gap, 20.0 s) 50.0%" in text
    fig = throughput_figure(tp)
    labels = [t.get_text() for ax in fig.axes if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    assert "busy (a request in flight) 45.0%" in labels
    assert "idle (nothing in flight, a shard generating) 5.0%" in labels
    assert "between tasks (no shard generating; cut out) 50.0%" in labels


def test_no_bin_spans_a_gap_and_the_gap_is_cut_out_of_the_plot() -> None:
    tp = throughput(TWO_SHARDS)
    gap = tp["server_time"]["between_tasks"][0]
    bins = tp["timeline"]
    assert tp["bin_s"] == 1.0 and len(bins) == 20
    for p in bins:
        lo, hi = p["t_s"], p["t_s"] + p["width_s"]
        assert hi <= gap["from_s"] or lo >= gap["to_s"], p
        assert (p["segment"] == 0) == (hi <= gap["from_s"])
    assert bins[10]["t_s"] == gap["to_s"]  # the second segment's bins start at its start
    fig = throughput_figure(tp)
    rate_ax = fig.axes[0]
    xs = [x for line in rate_ax.get_lines() for x in line.get_xdata()]
    # The 20 s between tasks are cut: the axis spans the 20 s of generation.
    assert max(xs) == pytest.approx(20.0)
    assert throughput_plot(tp)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_last_partial_bin_has_the_true_rate_not_a_spike() -> None:
    # One server at a steady 100 tok/s: 1.5 s requests of 150 tokens back to back, 0-10.5 s.
    comps = [_c("s0", 1.5 * i, 1.5 * (i + 1), 150) for i in range(7)]
    tp = throughput([_shard("shard-00000", *comps)])
    last = tp["timeline"][-1]
    assert (last["t_s"], last["width_s"]) == (10.0, 0.5)
    assert last["output_tokens_per_s"] == pytest.approx(100.0)
    assert all(p["output_tokens_per_s"] == pytest.approx(100.0) for p in tp["timeline"])
    assert sum(p["output_tokens_per_s"] * p["width_s"] for p in tp["timeline"]) == (
        pytest.approx(tp["output_tokens"]))


def test_tokens_are_conserved_and_spread_over_each_requests_time_in_flight() -> None:
    tp = throughput(TWO_SHARDS)
    bins = tp["timeline"]
    assert sum(p["output_tokens_per_s"] * p["width_s"] for p in bins) == pytest.approx(2600)
    # 0-6 s: s0 writes 100 tok/s and s1 100 tok/s; 6-10 s: s0 alone; 30-40 s: 50 + 50.
    assert [p["output_tokens_per_s"] for p in bins] == [200.0] * 6 + [100.0] * 4 + [100.0] * 10
    assert bins[7]["per_server"] == {"s0": 100.0, "s1": 0.0}
    assert (bins[7]["busy_servers"], bins[7]["idle_servers"]) == (1.0, 1.0)


def test_an_instant_request_and_an_empty_run_do_not_break_the_figures() -> None:
    tp = throughput([_shard("shard-00000", _c("s0", 0, 4, 40), _c("s0", 4, 4, 7))])
    assert sum(p["output_tokens_per_s"] * p["width_s"] for p in tp["timeline"]) == (
        pytest.approx(47))
    empty = throughput([_shard("shard-00000")])
    assert empty["server_time"] is None and empty["timeline"] == []
    assert describe_server_time(empty) == "No request was in flight on any server in this run."
    assert throughput_plot(empty)[:4] == b"\x89PNG"
