"""The report's counts: the funnel per shard and per source, and checks that files agree.

Pure functions over collected ``ShardFacts`` (see ``collect.py``); ``report.py`` assembles
them. Per-shard figures and totals come from the shards' manifests, per-source ones from the
manifests' skipped/failed lists and the journals' completed records (``SOURCES_OF_TRUTH`` in
``report.py`` names each source).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from include.reporting.collect import ShardFacts, source_of


def reason_counts(entries: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Return ``{source: {reason: n}}`` of manifest entries ``{"id", "reason"}``."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for e in entries:
        out[source_of(e["id"])][str(e.get("reason"))] += 1
    return {s: dict(sorted(c.items())) for s, c in out.items()}


def generation_figures(shards: list[ShardFacts]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (per-shard + totals from manifests, per-source from manifests and journals)."""
    per_shard: dict[str, dict[str, int]] = {}
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for s in shards:
        m = s.generated
        if m is None:
            continue
        per_shard[s.shard_id] = {
            "prompts": m["prompts"], "completed": m["counts"]["completed"],
            "skipped": m["counts"]["skipped"], "failed": m["counts"]["failed"],
            "truncated": m["truncated"],
        }
        skipped += m["skipped"]
        failed += m["failed"]
    totals = {k: sum(v[k] for v in per_shard.values())
              for k in ("prompts", "completed", "skipped", "failed", "truncated")}
    totals["sent"] = totals["completed"] + totals["failed"]
    skipped_by = reason_counts(skipped)
    failed_by = reason_counts(failed)
    completed: Counter[str] = Counter()
    truncated: Counter[str] = Counter()
    for s in shards:
        for c in s.completions:
            completed[c.source] += 1
            truncated[c.source] += c.finish_reason == "length"
    per_source = {}
    for src in sorted(set(completed) | set(skipped_by) | set(failed_by)):
        n_skipped = sum(skipped_by.get(src, {}).values())
        n_failed = sum(failed_by.get(src, {}).values())
        per_source[src] = {
            "prompts": completed[src] + n_skipped + n_failed,
            "sent": completed[src] + n_failed,
            "completed": completed[src],
            "truncated": truncated[src],
            "skipped": n_skipped,
            "skipped_by_reason": skipped_by.get(src, {}),
            "failed": n_failed,
            "failed_by_reason": failed_by.get(src, {}),
        }
    return {"per_shard": per_shard, "totals": totals}, per_source


def tokenization_figures(shards: list[ShardFacts]) -> tuple[dict[str, Any], dict[str, Any]]:
    per_shard: dict[str, dict[str, Any]] = {}
    quarantined: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    written: Counter[str] = Counter()
    for s in shards:
        m = s.tokenized
        if m is None:
            continue
        c = m["counts"]
        per_shard[s.shard_id] = {
            "input": c["input"], "written": c["written"],
            "quarantined": sum(c["quarantined"].values()),
            "dropped": sum(c["dropped"].values()),
            "truncated_to_max_length": c.get("truncated_to_max_length", 0),
            "tokens": m["tokens"]["total"], "loss_tokens": m["tokens"]["loss"],
        }
        quarantined += m["quarantined"]
        dropped += m["dropped"]
        written.update(src for src, _ in s.tokenized_lengths)
    keys = ("input", "written", "quarantined", "dropped", "truncated_to_max_length", "tokens",
            "loss_tokens")
    totals = {k: sum(v[k] for v in per_shard.values()) for k in keys}
    by_reason: dict[str, Counter[str]] = {"quarantined": Counter(), "dropped": Counter()}
    for shard in (s.tokenized for s in shards if s.tokenized):
        for kind in by_reason:
            by_reason[kind].update({r: n for r, n in shard["counts"][kind].items() if n})
    totals["quarantined_by_reason"] = dict(sorted(by_reason["quarantined"].items()))
    totals["dropped_by_reason"] = dict(sorted(by_reason["dropped"].items()))
    q_by, d_by = reason_counts(quarantined), reason_counts(dropped)
    per_source = {
        src: {"written": written[src],
              "quarantined_by_reason": q_by.get(src, {}),
              "dropped_by_reason": d_by.get(src, {})}
        for src in sorted(set(written) | set(q_by) | set(d_by))
    }
    return {"per_shard": per_shard, "totals": totals}, per_source


def ejections(generate_results: list[dict[str, Any]] | None) -> dict[str, int] | None:
    if generate_results is None:
        return None
    out: Counter[str] = Counter()
    for r in generate_results:
        for srv in (r or {}).get("servers") or []:
            if isinstance(srv, dict):
                out[srv["url"]] += int(srv.get("ejections") or 0)
    return dict(sorted(out.items()))


def consistency(report: dict[str, Any], shards: list[ShardFacts]) -> list[dict[str, Any]]:
    """Return checks that related figures from different files agree (``ok`` False if not)."""
    gen = report["generation"]["totals"]
    per_src = report["funnel"]["generation"]
    tok = report["tokenization"]["totals"]
    tok_src = report["funnel"]["tokenization"]
    checks = [
        ("completed: journal per source == generated manifests",
         sum(v["completed"] for v in per_src.values()), gen["completed"]),
        ("truncated: journal per source == generated manifests",
         sum(v["truncated"] for v in per_src.values()), gen["truncated"]),
        ("written: parquet rows == tokenized manifests",
         sum(v["written"] for v in tok_src.values()), tok["written"]),
        ("tokenizer input == generated completed (tokenized shards)",
         tok["input"], sum(report["generation"]["per_shard"].get(s, {}).get("completed", 0)
                           for s in report["tokenization"]["per_shard"])),
    ]
    return [{"check": name, "left": a, "right": b, "ok": a == b} for name, a, b in checks]
