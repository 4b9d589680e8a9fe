"""The report of a real small run agrees with the run's manifests, journals and parquet."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pyarrow.parquet as pq
import pytest

from include.layout import report_prefix
from include.reporting import QualityGateError, QualityGates, build_report, raise_for_gates
from include.storage import LocalStore
from tests.integration.reporting.real_run import build_run, run_settings, start_servers

pytestmark = pytest.mark.integration
LOOSE = QualityGates(max_truncation_rate=1, max_failure_rate=1, max_quarantine_rate=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer_dir):  # noqa: F811
    servers = start_servers(tokenizer_dir)
    try:
        settings = run_settings(tmp_path_factory.mktemp("out"), tokenizer_dir)
        ids, results = build_run(settings, [p.url for p in servers])
    finally:
        for p in servers:
            p.stop()
    store = LocalStore(settings.run_uri)
    summary = build_report(settings, store, store, ids, [], run_id="manual__1", gates=LOOSE,
                           generate_results=results)
    report = json.loads(store.read(report_prefix("manual__1") + "report.json"))
    return settings, store, ids, summary, report


def _jsonl(store, key):
    return [json.loads(x) for x in store.read(key).splitlines() if x.strip()]


def test_funnel_reconciles_with_the_prompt_and_generated_files(run) -> None:
    _, store, ids, _, report = run
    prompts = json.loads(store.read("prompts/manifest.json"))
    for name, src in prompts["sources"].items():
        mine = report["funnel"]["prepare"][name]
        assert (mine["read"], mine["kept"]) == (src["read"], src["kept"])
        assert sum(mine["dropped"].values()) == src["read"] - src["kept"]
    manifests = [json.loads(store.read(f"generated/{s}.manifest.json")) for s in ids]
    completed = [r for s in ids for r in _jsonl(store, f"generated/{s}.jsonl")]
    gen = report["funnel"]["generation"]
    by_src = Counter(r["source"] for r in completed)
    trunc = Counter(r["source"] for r in completed if r["finish_reason"] == "length")
    for src, n in by_src.items():
        assert gen[src]["completed"] == n and gen[src]["truncated"] == trunc[src]
    skipped = Counter(e["id"].split(":")[0] for m in manifests for e in m["skipped"])
    failed = Counter(e["id"].split(":")[0] for m in manifests for e in m["failed"])
    assert {s: v["skipped"] for s, v in gen.items() if v["skipped"]} == dict(skipped)
    assert {s: v["failed"] for s, v in gen.items() if v["failed"]} == dict(failed)
    totals = report["generation"]["totals"]
    for k in ("completed", "skipped", "failed"):
        assert totals[k] == sum(m["counts"][k] for m in manifests)
    assert totals["truncated"] == sum(m["truncated"] for m in manifests)
    # The run exercised every path the report describes.
    assert totals["truncated"] and totals["skipped"] and totals["completed"]
    assert all(c["ok"] for c in report["consistency"]), report["consistency"]
    assert report["tokenization"]["totals"]["quarantined"] == 0


def test_tokens_throughput_and_retries_reconcile_with_the_journals(run) -> None:
    _, store, ids, _, report = run
    final = {}
    for s in ids:
        for key in store.list(f"journal/{s}/"):
            for rec in _jsonl(store, key):
                final.setdefault(rec["id"], rec)
    done = [r for r in final.values() if r["status"] == "completed"]
    assert report["tokens"]["completion_tokens"] == sum(
        r["usage"]["completion_tokens"] for r in done)
    assert report["tokens"]["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in done)
    tp = report["throughput"]
    start = min(r["timings"]["finished_at"] - r["timings"]["latency_s"] for r in done)
    end = max(r["timings"]["finished_at"] for r in done)
    assert tp["wall_s"] == pytest.approx(end - start, abs=1e-3)
    assert tp["output_tokens"] == report["tokens"]["completion_tokens"]
    for srv, v in tp["per_server"].items():
        assert v["completed"] == sum(r["server"] == srv for r in done)
    extra = sum(r["timings"]["attempts"] - 1 for r in done) + sum(
        r.get("attempts", 1) - 1 for r in final.values() if r["status"] == "failed")
    assert tp["retries"]["extra_attempts"] == extra > 0
    assert report["servers"]["models"] == ["Qwen/Qwen3.6-27B"]
    assert set(report["servers"]["ejections"]) == set(tp["per_server"])


def test_tokenized_statistics_reconcile_with_the_tokenized_files(run) -> None:
    _, store, ids, _, report = run
    manifests = [json.loads(store.read(f"tokenized/{s}.manifest.json")) for s in ids]
    tok = report["tokenization"]["totals"]
    assert tok["written"] == sum(m["counts"]["written"] for m in manifests)
    assert tok["tokens"] == sum(m["tokens"]["total"] for m in manifests)
    assert tok["loss_tokens"] == sum(m["tokens"]["loss"] for m in manifests)
    assert tok["dropped_by_reason"].get("truncated_completion") == (
        report["generation"]["totals"]["truncated"])
    per_src: dict[str, list[dict]] = defaultdict(list)
    for m in manifests:
        for src, st in m["length_stats"].items():
            per_src[src].append(st)
    for src, stats in per_src.items():
        mine = report["tokenized_lengths"][src]
        n = sum(s["count"] for s in stats)
        assert mine["count"] == n
        assert mine["max"] == max(s["max"] for s in stats)
        assert mine["mean"] == pytest.approx(sum(s["mean"] * s["count"] for s in stats) / n,
                                             abs=0.01)
    lengths = [n for s in ids for n in pq.read_table(
        store.uri(f"tokenized/{s}.parquet"), columns=["length"]).column("length").to_pylist()]
    assert sum(v["count"] for v in report["tokenized_lengths"].values()) == len(lengths)


def test_truncation_gate_fails_the_real_run_just_over_and_passes_at_it(run) -> None:
    settings, store, ids, summary, _ = run
    gate = next(g for g in summary["gates"] if g["name"] == "max_truncation_rate")
    manifests = {s: json.loads(store.read(f"generated/{s}.manifest.json")) for s in ids}
    worst = max(ids, key=lambda s: (manifests[s]["truncated"], s[::-1]))
    measured = gate["measured"]
    ok = build_report(settings, store, store, ids, [], run_id="at",
                      gates=QualityGates(max_truncation_rate=measured, max_failure_rate=1,
                                         max_quarantine_rate=1), plots=False)
    raise_for_gates(ok)
    bad = build_report(settings, store, store, ids, [], run_id="over",
                       gates=QualityGates(max_truncation_rate=measured * 0.99,
                                          max_failure_rate=1, max_quarantine_rate=1),
                       plots=False)
    with pytest.raises(QualityGateError, match="max_truncation_rate") as err:
        raise_for_gates(bad)
    assert worst in str(err.value) and f"{measured:.4g}" in str(err.value)
    assert json.loads(store.read(report_prefix("over") + "report.json"))["passed"] is False
    assert store.exists("tokenized/" + ids[0] + ".parquet")  # outputs stay


def test_the_dataset_card_counts_the_tokenized_rows(run) -> None:
    import yaml

    from include.layout import card_key, report_card_key

    _, store, ids, summary, _ = run
    card = store.read(report_card_key("manual__1")).decode()
    header = yaml.safe_load(card.split("---\n", 2)[1])
    rows = sum(json.loads(store.read(f"tokenized/{s}.manifest.json"))["counts"]["written"]
               for s in ids)
    assert rows and header["dataset_info"]["splits"] == [{"name": "train",
                                                          "num_examples": rows}]
    # The loose gates pass and the run covers every shard: it publishes the root card.
    assert summary["passed"] and store.read(card_key()).decode() == card
