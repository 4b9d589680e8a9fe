"""Build a finished run's report: funnel, tokens, throughput, lengths, and its quality gates.

``build_report`` reads the run's own files, writes ``report/<run id>/`` next to the outputs
(``report.json``, ``report.md``, ``report.html`` and PNG plots, create-only, ``report.json``
last) and returns a summary for XCom and logs. Every figure has one source of truth, named in
``report.json`` under ``sources_of_truth``; where two files hold related figures (per-source
counts from journals, totals from manifests) the report checks that they agree under
``consistency`` instead of showing both.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from include.reporting.collect import (
    PROMPTS_MANIFEST,
    Completion,
    ShardFacts,
    collect_shard,
    read_json,
    source_of,
)
from include.reporting.gates import GateResult, QualityGates, evaluate_gates
from include.storage import Store
from include.tokenization.stage import length_stats

log = logging.getLogger(__name__)

REPORT_SCHEMA = 1

SOURCES_OF_TRUTH: dict[str, str] = {
    "funnel.prepare": "prompts/manifest.json: sources.<name>.read/kept/dropped",
    "generation.per_shard, generation.totals": (
        "generated/<shard>.manifest.json: prompts, counts, truncated"),
    "funnel.generation.<source>.skipped/failed": (
        "generated/<shard>.manifest.json: skipped/failed lists (source = id prefix)"),
    "funnel.generation.<source>.completed/truncated, tokens.prompt/completion, lengths": (
        "journal/<shard>/part-*.jsonl: final completed record per id (source, finish_reason, "
        "usage)"),
    "throughput, drains, retries": (
        "journal/<shard>/part-*.jsonl of the shards this run produced: timings.finished_at, "
        "timings.latency_s (start = finished_at - latency_s), timings.attempts, server, usage; "
        "failed records: attempts"),
    "servers.models": "journal completed records: model (what the servers answered with)",
    "servers.context_length": (
        "launch_servers report: expected.context_length (checked on every server by "
        "wait_for_server); settings.context_length when no launch report is given"),
    "servers.ejections": (
        "generated/<shard>.manifest.json generation.servers[].ejections"),
    "tokenization.totals, tokenization.per_shard": (
        "tokenized/<shard>.manifest.json: counts, tokens"),
    "funnel.tokenization.<source>.quarantined/dropped": (
        "tokenized/<shard>.manifest.json: quarantined/dropped lists (source = id prefix)"),
    "funnel.tokenization.<source>.written, tokenized_lengths": (
        "tokenized/<shard>.parquet: source and length columns"),
    "shards": "the DAG's plan: shards produced by this run and shards reused as complete",
    "gates": "computed from generation.per_shard, tokenization.per_shard, funnel.generation",
}


def report_prefix(run_id: str) -> str:
    """Return the store prefix of one Airflow run's report (``report/<safe run id>/``).

    One folder per Airflow run: a later backfill of the same run writes its own report
    instead of colliding with the first one's create-only files.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_") or "manual"
    return f"report/{safe}/"


# --- figures ----------------------------------------------------------------------------------
def _reason_counts(entries: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Return ``{source: {reason: n}}`` of manifest entries ``{"id", "reason"}``."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for e in entries:
        out[source_of(e["id"])][str(e.get("reason"))] += 1
    return {s: dict(sorted(c.items())) for s, c in out.items()}


def _stats(values: list[int]) -> dict[str, float | int]:
    return length_stats(values)


def _generation(shards: list[ShardFacts]) -> tuple[dict[str, Any], dict[str, Any]]:
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
    skipped_by = _reason_counts(skipped)
    failed_by = _reason_counts(failed)
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


def _tokenization(shards: list[ShardFacts]) -> tuple[dict[str, Any], dict[str, Any]]:
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
    q_by, d_by = _reason_counts(quarantined), _reason_counts(dropped)
    per_source = {
        src: {"written": written[src],
              "quarantined_by_reason": q_by.get(src, {}),
              "dropped_by_reason": d_by.get(src, {})}
        for src in sorted(set(written) | set(q_by) | set(d_by))
    }
    return {"per_shard": per_shard, "totals": totals}, per_source


def _nice_bin(wall_s: float, bins: int = 60) -> float:
    raw = max(wall_s / bins, 1.0)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if raw <= step:
            return float(step)
    return 3600.0 * math.ceil(raw / 3600)


def _throughput(produced: list[ShardFacts]) -> dict[str, Any]:
    """Return throughput over time and per server, drains and retries of produced shards."""
    comps = [c for s in produced for c in s.completions if c.finished_at]
    retries = {
        "extra_attempts": sum(c.attempts - 1 for s in produced for c in s.completions)
        + sum(a - 1 for s in produced for a in s.failed_attempts),
        "prompts_retried": sum(c.attempts > 1 for s in produced for c in s.completions)
        + sum(a > 1 for s in produced for a in s.failed_attempts),
    }
    if not comps:
        return {"wall_s": 0.0, "output_tokens": 0, "output_tokens_per_s": 0.0, "bin_s": 0,
                "timeline": [], "per_server": {}, "drains": {"per_shard": {}}, "retries": retries}
    start = min(c.finished_at - c.latency_s for c in comps)
    end = max(c.finished_at for c in comps)
    wall = max(end - start, 1e-9)
    out_tokens = sum(c.completion_tokens for c in comps)
    bin_s = _nice_bin(wall)
    n_bins = max(1, math.ceil(wall / bin_s))
    servers = sorted({c.server for c in comps})
    series = {srv: [0] * n_bins for srv in servers}
    for c in comps:
        i = min(n_bins - 1, int((c.finished_at - start) / bin_s))
        series[c.server][i] += c.completion_tokens
    # The last bin is cut at the end of the run; rates divide by each bin's real width.
    widths = [max(min(bin_s, wall - i * bin_s), 1e-9) for i in range(n_bins)]
    timeline = [
        {"t_s": round(i * bin_s, 3), "width_s": round(widths[i], 3),
         "output_tokens_per_s": round(sum(series[s][i] for s in servers) / widths[i], 2),
         "per_server": {s: round(series[s][i] / widths[i], 2) for s in servers}}
        for i in range(n_bins)
    ]
    per_server = {}
    for srv in servers:
        mine = [c for c in comps if c.server == srv]
        last = max(c.finished_at for c in mine)
        tokens = sum(c.completion_tokens for c in mine)
        per_server[srv] = {
            "completed": len(mine), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 2),
            "first_start_s": round(min(c.finished_at - c.latency_s for c in mine) - start, 3),
            "last_finish_s": round(last - start, 3),
            # Time this server sat idle at the end while others finished their last requests.
            "idle_tail_s": round(end - last, 3),
        }
    per_shard = {}
    for s in produced:
        mine = [c for c in s.completions if c.finished_at]
        if not mine:
            continue
        last_start = max(c.finished_at - c.latency_s for c in mine)
        last_finish = max(c.finished_at for c in mine)
        per_shard[s.shard_id] = {"drain_s": round(max(last_finish - last_start, 0.0), 3)}
    last_start = max(c.finished_at - c.latency_s for c in comps)
    idle = sum(v["idle_tail_s"] for v in per_server.values())
    drains = {
        "per_shard": per_shard,
        "run_drain_s": round(max(end - last_start, 0.0), 3),
        "idle_server_seconds": round(idle, 3),
        "idle_fraction": round(idle / (wall * len(servers)), 4),
    }
    return {
        "start": round(start, 3), "end": round(end, 3), "wall_s": round(wall, 3),
        "output_tokens": out_tokens, "output_tokens_per_s": round(out_tokens / wall, 2),
        "bin_s": bin_s, "timeline": timeline, "per_server": per_server, "drains": drains,
        "retries": retries, "no_request_in_flight": _gaps(comps, start),
    }


def _gaps(comps: list[Any], start: float, min_s: float = 0.5) -> list[dict[str, float]]:
    """Return the spans (seconds from ``start``) when no request was in flight on any server.

    Such a span is time between shards (no shard task running: the scheduler, a worker slot,
    a staggered start), told apart from a server idling while others work.
    """
    spans = sorted((c.finished_at - c.latency_s, c.finished_at) for c in comps)
    gaps, reach = [], spans[0][1]
    for lo, hi in spans[1:]:
        if lo - reach >= min_s:
            gaps.append({"from_s": round(reach - start, 3), "to_s": round(lo - start, 3)})
        reach = max(reach, hi)
    return gaps


def _ejections(generate_results: list[dict[str, Any]] | None) -> dict[str, int] | None:
    if generate_results is None:
        return None
    out: Counter[str] = Counter()
    for r in generate_results:
        for srv in (r or {}).get("servers") or []:
            if isinstance(srv, dict):
                out[srv["url"]] += int(srv.get("ejections") or 0)
    return dict(sorted(out.items()))


def _consistency(report: dict[str, Any], shards: list[ShardFacts]) -> list[dict[str, Any]]:
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


# --- the report -------------------------------------------------------------------------------
def compute_report(
    settings: Any,
    prompts_manifest: dict[str, Any],
    shards: list[ShardFacts],
    *,
    run_id: str,
    outputs_uri: str,
    gates: QualityGates,
    launch: dict[str, Any] | None = None,
    generate_results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Return the report data of collected shard facts (no I/O; see ``build_report``)."""
    generation, gen_src = _generation(shards)
    tokenization, tok_src = _tokenization(shards)
    produced = [s for s in shards if not s.reused]
    prepare = {
        name: {"read": s["read"], "kept": s["kept"],
               "dropped": {r: n for r, n in s["dropped"].items() if n}}
        for name, s in prompts_manifest["sources"].items()
    }
    comps: list[Completion] = [c for s in shards for c in s.completions]
    by_src: dict[str, list[Completion]] = defaultdict(list)
    for c in comps:
        by_src[c.source].append(c)
    tokens_src = {src: {"prompt_tokens": sum(c.prompt_tokens for c in cs),
                        "completion_tokens": sum(c.completion_tokens for c in cs)}
                  for src, cs in sorted(by_src.items())}
    lengths = {src: {"prompt_tokens": _stats([c.prompt_tokens for c in cs]),
                     "completion_tokens": _stats([c.completion_tokens for c in cs])}
               for src, cs in sorted(by_src.items())}
    tok_lengths: dict[str, list[int]] = defaultdict(list)
    for s in shards:
        for src, n in s.tokenized_lengths:
            tok_lengths[src].append(n)
    context_length = ((launch or {}).get("expected") or {}).get("context_length")
    missing = [s.shard_id for s in shards if s.generated is None or s.tokenized is None]
    # Sources the prepare stage kept prompts from are the ones expected to have completions.
    expected_sources = [n for n, s in prompts_manifest["sources"].items() if s["kept"]]
    completed_per_source = {src: gen_src.get(src, {}).get("completed", 0)
                            for src in expected_sources}
    gate_input = {
        sid: {**generation["per_shard"].get(sid, {}),
              "quarantined": tokenization["per_shard"].get(sid, {}).get("quarantined", 0),
              "tokenizer_input": tokenization["per_shard"].get(sid, {}).get("input", 0)}
        for sid in (s.shard_id for s in shards)
    }
    results = evaluate_gates(gates, gate_input, completed_per_source)
    results.append(GateResult("all_shards_complete", 0, len(missing), not missing,
                              None, None, [{"name": m, "count": 1} for m in missing[:5]]))
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "run": {
            "run_name": settings.run_name, "run_uri": settings.run_uri,
            "outputs_uri": outputs_uri, "airflow_run_id": run_id,
            "shard_range": settings.shard_range, "force_regenerate": settings.force_regenerate,
            "max_tokens": settings.max_tokens,
        },
        "passed": all(r.passed for r in results),
        "gates": [r.to_dict() for r in results],
        "thresholds": gates.__dict__.copy(),
        "shards": {
            "in_run": len(prompts_manifest["shards"]),
            "produced": sorted(s.shard_id for s in produced),
            "reused": sorted(s.shard_id for s in shards if s.reused),
            "missing_outputs": missing,
        },
        "funnel": {"prepare": prepare, "prepare_totals": prompts_manifest["totals"],
                   "generation": gen_src, "tokenization": tok_src},
        "generation": generation,
        "tokenization": tokenization,
        "tokens": {"per_source": tokens_src,
                   "prompt_tokens": sum(c.prompt_tokens for c in comps),
                   "completion_tokens": sum(c.completion_tokens for c in comps)},
        "throughput": _throughput(produced),
        "servers": {
            "models": sorted({c.model for c in comps if c.model}),
            "context_length": context_length or settings.context_length,
            "context_length_from": "launch_servers" if context_length else "settings",
            "ejections": _ejections(generate_results),
        },
        "lengths": lengths,
        "tokenized_lengths": {src: _stats(v) for src, v in sorted(tok_lengths.items())},
        "sources_of_truth": SOURCES_OF_TRUTH,
    }
    report["consistency"] = _consistency(report, shards)
    return report


def build_report(
    settings: Any,
    run_store: Store,
    outputs_store: Store,
    shard_ids: list[str],
    reused_shards: list[str],
    *,
    run_id: str = "manual",
    gates: QualityGates | None = None,
    launch: dict[str, Any] | None = None,
    generate_results: list[dict[str, Any]] | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Write the run's report under ``report/<run id>/`` in ``outputs_store``; return a summary.

    ``shard_ids`` are the shards this run produced, ``reused_shards`` those it found complete
    (a shard-range backfill); both are read from ``outputs_store``, the prompt manifest from
    ``run_store``. ``launch`` is the launch_servers XCom; ``generate_results`` (for
    ejections) defaults to the ``generation`` entry of each shard's generated manifest.
    Never raises for broken gates: the summary says ``passed`` and ``raise_for_gates`` fails
    the task. Files are written create-only, ``report.json`` last, and are byte-identical
    when rebuilt from the same inputs, so a retried report task succeeds.
    """
    gates = gates or QualityGates.from_settings(settings)
    manifest = read_json(run_store, PROMPTS_MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{run_store.uri(PROMPTS_MANIFEST)} does not exist")
    reused = set(reused_shards)
    ordered = sorted(set(shard_ids) | reused)
    shards = [collect_shard(outputs_store, sid, sid in reused) for sid in ordered]
    outputs_uri = outputs_store.root.rstrip("/")
    if generate_results is None:
        # The upload task records each shard's generation stats (servers, ejections) in the
        # shard's generated manifest: the one source for them.
        generate_results = [s.generated["generation"] for s in shards
                            if s.generated and s.generated.get("generation")] or None
    report = compute_report(settings, manifest, shards, run_id=run_id, outputs_uri=outputs_uri,
                            gates=gates, launch=launch, generate_results=generate_results)
    prefix = report_prefix(run_id)
    report["report_uri"] = outputs_store.uri(prefix + "report.html")
    files: dict[str, bytes] = {}
    if plots:
        from include.reporting.plots import render_plots

        plots_data = render_plots(report, raw_lengths(shards))
        files.update({prefix + name: data for name, data in plots_data.items()})
    report["plots"] = sorted(k[len(prefix):] for k in files)
    from include.reporting.render import render_html, render_markdown

    files[prefix + "report.md"] = render_markdown(report).encode()
    files[prefix + "report.html"] = render_html(report).encode()
    for key, data in files.items():
        outputs_store.write_new(key, data)
    data = (json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    outputs_store.write_new(prefix + "report.json", data)
    summary = summarize(report)
    log.info("%s", format_summary(summary))
    return summary


def raw_lengths(shards: list[ShardFacts]) -> dict[str, dict[str, list[int]]]:
    """Return the per-source length lists the report's length statistics summarise."""
    raw: dict[str, dict[str, list[int]]] = {
        "prompt_tokens": defaultdict(list), "completion_tokens": defaultdict(list),
        "tokenized_length": defaultdict(list)}
    for s in shards:
        for c in s.completions:
            raw["prompt_tokens"][c.source].append(c.prompt_tokens)
            raw["completion_tokens"][c.source].append(c.completion_tokens)
        for src, n in s.tokenized_lengths:
            raw["tokenized_length"][src].append(n)
    return raw


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Return the small part of a report that goes to XCom, logs and the asset event."""
    gen = report["generation"]["totals"]
    tok = report["tokenization"]["totals"]
    return {
        "passed": report["passed"],
        "run": report["run"],
        "report_uri": report["report_uri"],
        "gates": report["gates"],
        "shards_produced": len(report["shards"]["produced"]),
        "shards_reused": len(report["shards"]["reused"]),
        "generation": {k: gen[k] for k in ("prompts", "completed", "skipped", "failed",
                                           "truncated")},
        "tokenized": {k: tok[k] for k in ("written", "quarantined", "dropped", "tokens",
                                          "loss_tokens")},
        "output_tokens_per_s": report["throughput"]["output_tokens_per_s"],
        "consistency_ok": all(c["ok"] for c in report["consistency"]),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """Return the summary as a few log lines (one per gate)."""
    g, t = summary["generation"], summary["tokenized"]
    lines = [
        f"run {summary['run']['run_name']} report: {'PASSED' if summary['passed'] else 'FAILED'}"
        f" | {summary['shards_produced']} shards produced, {summary['shards_reused']} reused",
        f"  generation: {g['completed']} completed ({g['truncated']} truncated), "
        f"{g['skipped']} skipped, {g['failed']} failed of {g['prompts']} prompts; "
        f"{summary['output_tokens_per_s']:.0f} output tok/s",
        f"  tokenized: {t['written']} samples, {t['tokens']} tokens ({t['loss_tokens']} in the "
        f"loss), {t['quarantined']} quarantined, {t['dropped']} dropped",
        *("  " + gate["message"] for gate in summary["gates"]),
        f"  report: {summary['report_uri']}",
    ]
    if not summary["consistency_ok"]:
        lines.append("  WARNING: manifests and journals disagree; see consistency in report.json")
    return "\n".join(lines)


def report_run(
    settings: Any, produced: list[str], run_id: str, launch: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write the report of a DAG run whose shard group produced ``produced``; return its summary.

    Shards the run's ``shard_range`` selects but did not produce are reported as reused
    (complete from an earlier run). Never raises for a broken gate (see ``raise_for_gates``).
    """
    from include.prompts.plan import open_run_store, outputs_uri
    from include.prompts.prepare import shard_id

    run_store = open_run_store(settings)
    manifest = read_json(run_store, PROMPTS_MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{run_store.uri(PROMPTS_MANIFEST)} does not exist")
    selected = [shard_id(n) for n in settings.shard_numbers(len(manifest["shards"]))
                if manifest["shards"][n]["count"]]
    done = set(produced)
    reused = [s for s in selected if s not in done]
    outputs = open_run_store(settings, outputs_uri(settings, run_id))
    return build_report(settings, run_store, outputs, produced, reused, run_id=run_id,
                        launch=launch)
