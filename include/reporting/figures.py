"""The report's counts: the funnel per shard and per source, and checks that files agree.

Pure functions over collected ``ShardFacts`` (see ``collect.py``); ``report.py`` assembles
them. Per-shard figures and totals come from the shards' manifests, per-source ones from the
manifests' skipped/failed lists and the completed records' facts (``SOURCES_OF_TRUTH`` in
``report.py`` names each source).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from include.conversations.chain import ConversationEnd
from include.quality import QUALITY_FILTERS
from include.reporting.collect import ShardFacts
from include.reporting.facts import source_of
from include.tokenization.outputs import length_stats


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


def checked_records(manifest: dict[str, Any]) -> int:
    """Return how many completions a tokenized shard checked: a whole conversation's
    turns are checked (and quarantined) one by one, so each counts, not the conversation."""
    conv = manifest.get("conversations") or {}
    return manifest["counts"]["input"] - conv.get("conversations", 0) + conv.get("turns", 0)


def tokenization_figures(shards: list[ShardFacts]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (per-shard + totals from tokenized manifests, per-source from their lists)."""
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
            "input": c["input"], "checked": checked_records(m), "written": c["written"],
            "quarantined": sum(c["quarantined"].values()),
            "filtered": sum(c["quarantined"].get(r, 0) for r in QUALITY_FILTERS),
            "dropped": sum(c["dropped"].values()),
            "truncated_to_max_length": c.get("truncated_to_max_length", 0),
            "tokens": m["tokens"]["total"], "loss_tokens": m["tokens"]["loss"],
        }
        quarantined += m["quarantined"]
        dropped += m["dropped"]
        written.update(src for src, _ in s.tokenized_lengths)
    keys = ("input", "checked", "written", "quarantined", "filtered", "dropped",
            "truncated_to_max_length", "tokens", "loss_tokens")
    totals = {k: sum(v[k] for v in per_shard.values()) for k in keys}
    by_reason: dict[str, Counter[str]] = {"quarantined": Counter(), "dropped": Counter()}
    for shard in (s.tokenized for s in shards if s.tokenized):
        for kind in by_reason:
            by_reason[kind].update({r: n for r, n in shard["counts"][kind].items() if n})
    totals["quarantined_by_reason"] = dict(sorted(by_reason["quarantined"].items()))
    totals["dropped_by_reason"] = dict(sorted(by_reason["dropped"].items()))
    totals["filtered_by_reason"] = {r: by_reason["quarantined"].get(r, 0)
                                    for r in QUALITY_FILTERS}
    q_by, d_by = reason_counts(quarantined), reason_counts(dropped)
    per_source = {
        src: {"written": written[src],
              "quarantined_by_reason": q_by.get(src, {}),
              "filtered_by_reason": {r: n for r, n in q_by.get(src, {}).items()
                                     if r in QUALITY_FILTERS},
              "dropped_by_reason": d_by.get(src, {})}
        for src in sorted(set(written) | set(q_by) | set(d_by))
    }
    return {"per_shard": per_shard, "totals": totals}, per_source


def quality_filter_figures(shards: list[ShardFacts], tokenization: dict[str, Any],
                           per_source: dict[str, Any]) -> dict[str, Any]:
    """Return the output quality filters' counts: per filter (and whether it ran), per source.

    A filter is ``off`` when a tokenized shard's settings list it in ``quality_filters_off``.
    """
    off = sorted({name for s in shards if s.tokenized
                  for name in (s.tokenized.get("settings") or {}).get("quality_filters_off")
                  or ()})
    totals = tokenization["totals"]
    return {
        "filters": {r: {"quarantined": totals["filtered_by_reason"][r], "off": r in off}
                    for r in QUALITY_FILTERS},
        "filtered": totals["filtered"], "checked": totals["checked"], "off": off,
        "per_source": {src: v["filtered_by_reason"] for src, v in per_source.items()
                       if v["filtered_by_reason"]},
    }


def variant_figures(shards: list[ShardFacts]) -> dict[str, Any] | None:
    """Return lengths, truncations and quality-filter quarantines per sampling variant
    (setting ``sampling_variants``); None when the run had one sampling.

    A quarantined row is counted under its prompt's variant (a conversation's turn
    ``<id>#turn-k`` under its conversation's).
    """
    comps = [c for s in shards for c in s.completions if c.variant]
    if not comps:
        return None
    variant_of = {c.prompt_id: c.variant for c in comps}
    by_variant: dict[str, list[Any]] = {}
    for c in comps:
        by_variant.setdefault(c.variant, []).append(c)
    filtered: dict[str, Counter[str]] = {v: Counter() for v in by_variant}
    for s in shards:
        for q in (s.tokenized or {}).get("quarantined") or ():
            variant = variant_of.get(str(q.get("id", "")).split("#turn-")[0])
            if variant is not None and q.get("reason") in QUALITY_FILTERS:
                filtered[variant][q["reason"]] += 1
    return {v: {"completed": len(cs),
                "truncated": sum(c.finish_reason == "length" for c in cs),
                "prompt_tokens": length_stats([c.prompt_tokens for c in cs]),
                "completion_tokens": length_stats([c.completion_tokens for c in cs]),
                "filtered": dict(sorted(filtered[v].items()))}
            for v, cs in sorted(by_variant.items())}


def conversation_figures(shards: list[ShardFacts]) -> dict[str, Any] | None:
    """Return the whole conversations' counts summed over the tokenized manifests (None when
    no shard had any): conversations, turns, whole and per-turn rows, why conversations were
    kept apart, why they ended, one example of a prefix-stability difference."""
    found = [s.tokenized["conversations"] for s in shards
             if s.tokenized and s.tokenized.get("conversations")]
    if not found:
        return None
    kept_apart: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for c in found:
        kept_apart.update(c.get("kept_apart") or {})
        ends.update(c.get("ends") or {})
    # Every known end reason shown, 0 included: "none failed" is worth reading.
    end_counts = {str(r): ends.get(r, 0) for r in ConversationEnd}
    end_counts.update({r: n for r, n in sorted(ends.items()) if r not in end_counts})
    return {
        **{k: sum(int(c.get(k) or 0) for c in found)
           for k in ("conversations", "turns", "whole_rows", "turn_rows")},
        "kept_apart": dict(sorted(kept_apart.items())),
        "ends": end_counts,
        "example_difference": next((c["example_difference"] for c in found
                                    if c.get("example_difference")), ""),
    }


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
