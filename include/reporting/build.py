"""Build a finished run's report: funnel, tokens, throughput, lengths, and its quality gates.

``build_report`` reads the run's own files, writes ``report/<run id>/`` next to the outputs
(``report.json``, ``report.md``, ``report.html`` and PNG plots, create-only, ``report.json``
last) and returns a summary for XCom and logs. Every figure has one source of truth, named in
``report.json`` under ``sources_of_truth``; where two files hold related figures (per-source
counts from journals, totals from manifests) the report checks that they agree under
``consistency`` instead of showing both. The counts are computed in ``figures.py``, the timings
in ``throughput.py``; this module assembles, writes and summarises the report, and writes the
dataset card (``card.py``) beside it and, for the run that publishes the dataset, at the root
of the outputs.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

from include.layout import (
    EVAL_SHARD,
    MANIFEST_KEY,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MARKDOWN,
    card_key,
    eval_key,
    generated_keys,
    pretokenized_key,
    report_card_key,
    report_prefix,
    shard_index,
    tokenized_keys,
)
from include.reporting.card import render_card
from include.reporting.collect import ShardFacts, collect_shard, read_json
from include.reporting.facts import Completion
from include.reporting.figures import (
    consistency,
    conversation_figures,
    ejections,
    generation_figures,
    quality_filter_figures,
    tokenization_figures,
    variant_figures,
)
from include.reporting.gates import GateResult, QualityGates, evaluate_gates
from include.reporting.throughput import throughput
from include.reporting.trainers import export_figures, write_run_export
from include.storage import ObjectExistsError, Store
from include.tokenization.outputs import length_stats

log = logging.getLogger(__name__)

REPORT_SCHEMA = 1

SOURCES_OF_TRUTH: dict[str, str] = {
    "funnel.prepare": "prompts/manifest.json: sources.<name>.read/kept/dropped",
    "generation.per_shard, generation.totals": (
        "generated/<shard>.manifest.json: prompts, counts, truncated"),
    "funnel.generation.<source>.skipped/failed": (
        "generated/<shard>.manifest.json: skipped/failed lists (source = id prefix)"),
    "funnel.generation.<source>.completed/truncated, tokens.prompt/completion, lengths": (
        "generated/<shard>.facts.json: per completed record (source, finish_reason, usage), "
        "written from the journal's final record per id (a shard published before the facts "
        "existed: journal/<shard>/part-*.jsonl)"),
    "throughput.server_time": (
        "generated/<shard>.facts.json of the shards this run produced: each request's span "
        "(finished_at - latency_s to finished_at) per server; each shard's generating window "
        "from its first request's start to its last request's finish"),
    "throughput, drains, retries": (
        "generated/<shard>.facts.json of the shards this run produced: timings.finished_at, "
        "timings.latency_s (start = finished_at - latency_s), timings.attempts, server, usage; "
        "failed records: attempts"),
    "servers.models": "facts of completed records: model (what the servers answered with)",
    "servers.versions": (
        "facts of completed records: server, model, server_version (as the record says the "
        "server reported it; empty when it does not)"),
    "servers.context_length": (
        "launch_servers report: expected.context_length (checked on every server by "
        "wait_for_server); settings.context_length when no launch report is given"),
    "servers.ejections": (
        "generated/<shard>.manifest.json generation.servers[].ejections"),
    "tokenization.totals, tokenization.per_shard": (
        "tokenized/<shard>.manifest.json: counts, tokens"),
    "funnel.tokenization.<source>.quarantined/dropped": (
        "tokenized/<shard>.manifest.json: quarantined/dropped lists (source = id prefix)"),
    "quality_filters": (
        "tokenized/<shard>.manifest.json: counts.quarantined of the output quality filters' "
        "reasons, quarantined list (source = id prefix), settings.quality_filters_off"),
    "conversations": "tokenized/<shard>.manifest.json: conversations (summed over shards)",
    "settings_fingerprint": (
        "given by the report task, else the value every generated/<shard>.manifest.json "
        "agrees on (generation.settings_fingerprint)"),
    "funnel.tokenization.<source>.written, tokenized_lengths": (
        "tokenized/<shard>.manifest.json: lengths (a shard tokenized before them: "
        "tokenized/<shard>.parquet's source and length columns)"),
    "trainers.longest_row": "tokenized/<shard>.manifest.json: lengths (the longest row)",
    "trainers.text_path, trainers.conversations_by_source": (
        "tokenized/<shard>.manifest.json: text_path, conversations.by_source (summed)"),
    "trainer_export": (
        "pretokenized/<shard>.jsonl of every shard, joined into pretokenized.jsonl by the "
        "report that publishes the whole dataset"),
    "shards": "the DAG's plan: shards produced by this run and shards reused as complete",
    "gates": "computed from generation.per_shard, tokenization.per_shard, funnel.generation",
}


def _stats(values: list[int]) -> dict[str, float | int]:
    return length_stats(values)


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
    settings_fingerprint: str | None = None,
) -> dict[str, Any]:
    """Return the report data of collected shard facts (no I/O; see ``build_report``)."""
    generation, gen_src = generation_figures(shards)
    tokenization, tok_src = tokenization_figures(shards)
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
                        "completion_tokens": sum(c.completion_tokens for c in cs),
                        **_reasoning_total(cs)}
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
    gate_input = {}
    for sid in (s.shard_id for s in shards):
        tok = tokenization["per_shard"].get(sid, {})
        # The quality filters' quarantines have their own gate: the rest are pipeline bugs.
        gate_input[sid] = {**generation["per_shard"].get(sid, {}),
                           "quarantined": tok.get("quarantined", 0) - tok.get("filtered", 0),
                           "filtered": tok.get("filtered", 0), "checked": tok.get("checked", 0)}
    results = evaluate_gates(gates, gate_input, completed_per_source,
                             tokenization["totals"]["filtered_by_reason"])
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
            # force_regenerate: which shards were generated again, and why (their journal's
            # settings record, carried into the generated manifest).
            "regenerated": regenerated_shards(shards),
        },
        "funnel": {"prepare": prepare, "prepare_totals": prompts_manifest["totals"],
                   "generation": gen_src, "tokenization": tok_src},
        "generation": generation,
        "tokenization": tokenization,
        "quality_filters": quality_filter_figures(shards, tokenization, tok_src),
        "conversations": conversation_figures(shards),
        "variants": variant_figures(shards),
        "tokens": {"per_source": tokens_src,
                   "prompt_tokens": sum(c.prompt_tokens for c in comps),
                   "completion_tokens": sum(c.completion_tokens for c in comps),
                   **_reasoning_total(comps)},
        "throughput": throughput(produced),
        "servers": {
            "models": sorted({c.model for c in comps if c.model}),
            "versions": server_versions(comps),
            "context_length": context_length or settings.context_length,
            "context_length_from": "launch_servers" if context_length else "settings",
            "ejections": ejections(generate_results),
        },
        "lengths": lengths,
        "tokenized_lengths": {src: _stats(v) for src, v in sorted(tok_lengths.items())},
        "trainers": export_figures([s.tokenized for s in shards],
                                   max((max(v) for v in tok_lengths.values() if v), default=0)),
        "settings_fingerprint": settings_fingerprint or agreed_fingerprint(shards),
        "sources_of_truth": SOURCES_OF_TRUTH,
    }
    report["consistency"] = consistency(report, shards)
    return report


def regenerated_shards(shards: list[ShardFacts]) -> list[dict[str, Any]]:
    """Return each shard this run regenerated (``force_regenerate``) with its reason."""
    out = []
    for s in shards:
        regeneration = ((s.generated or {}).get("generation") or {}).get("regeneration")
        if regeneration:
            out.append({"shard": s.shard_id, "reason": regeneration.get("reason"),
                        "earlier_journal": regeneration.get("earlier_journal")})
    return out


def _reasoning_total(comps: list[Completion]) -> dict[str, int]:
    """Return ``{"reasoning_tokens": n}`` when every server counted them, else {}."""
    counts = [c.reasoning_tokens for c in comps]
    if not counts or any(n is None for n in counts):
        return {}
    return {"reasoning_tokens": sum(n for n in counts if n is not None)}


def server_versions(comps: list[Completion]) -> list[dict[str, Any]]:
    """Return each server that answered, with the model and SGLang version(s) it recorded.

    The dataset card's server table, with the weight versions its answers carried.
    """
    seen: dict[str, tuple[set[str], set[str], set[str]]] = defaultdict(
        lambda: (set(), set(), set()))
    for c in comps:
        models, versions, weights = seen[c.server]
        models.add(c.model)
        versions.add(c.server_version)
        weights.add(c.weight_version)
    return [{"url": url, "model": ", ".join(sorted(m - {""})) or None,
             "version": ", ".join(sorted(v - {""})) or None,
             "weight_version": ", ".join(sorted(w - {""})) or None}
            for url, (m, v, w) in sorted(seen.items()) if url]


def agreed_fingerprint(shards: list[ShardFacts]) -> str | None:
    """Return the settings fingerprint every shard's generated manifest records, else None
    (a shard without one, or shards generated under different settings)."""
    found = {((s.generated or {}).get("generation") or {}).get("settings_fingerprint")
             for s in shards}
    return found.pop() if len(found) == 1 else None


def dataset_complete(manifest: dict[str, Any], shards: list[ShardFacts]) -> bool:
    """Return whether the report covers every non-empty shard of the run, all with outputs."""
    covered = {s.shard_id for s in shards if s.generated and s.tokenized}
    return all(s["shard_id"] in covered for s in manifest["shards"] if s["count"])


def write_cards(outputs_store: Store, report: dict[str, Any], manifest: dict[str, Any],
                settings: Any, *, publish: bool) -> dict[str, Any]:
    """Write the dataset card into the report folder and, if ``publish``, at the outputs' root.

    The root card is create-only and stays: it is written by the first run that publishes
    the whole dataset (gates passed, every shard covered); a later run (a backfill that
    reuses every shard, a re-run) keeps it and says so, while its own card stays in its
    report folder. Rewriting identical bytes (a retried task) counts as written.
    """
    data = render_card(report, manifest, settings.to_dict(),
                       servers=report["servers"]["versions"] or None,
                       settings_fingerprint=report.get("settings_fingerprint")).encode()
    run_id = report["run"]["airflow_run_id"]
    outputs_store.write_new(report_card_key(run_id), data)
    root = "not written: the run did not publish the whole dataset (gates or shards missing)"
    if publish:
        try:
            outputs_store.write_new(card_key(), data)
            root = "written by this run"
        except ObjectExistsError:
            root = "kept: an earlier run's card is at the root (this run's is in its report)"
    return {"report_uri": outputs_store.uri(report_card_key(run_id)),
            "root_uri": outputs_store.uri(card_key()), "root": root}


def held_out_answers(outputs_store: Store) -> dict[str, Any] | None:
    """Return what the target answered of the held-out split (its ``eval/`` shard), or None
    while it is not tokenized: prompts, completions, rows and where they are."""
    index = shard_index(EVAL_SHARD)
    parquet, _, manifest_key = map(eval_key, tokenized_keys(index))
    tokenized = read_json(outputs_store, manifest_key)
    if tokenized is None:
        return None
    generated = read_json(outputs_store, eval_key(generated_keys(index)[1])) or {}
    return {"prompts": generated.get("prompts", 0),
            "completed": (generated.get("counts") or {}).get("completed", 0),
            "rows": tokenized["counts"]["written"], "parquet": parquet,
            "pretokenized": eval_key(pretokenized_key(index))}


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
    settings_fingerprint: str | None = None,
) -> dict[str, Any]:
    """Write the run's report under ``report/<run id>/`` in ``outputs_store``; return a summary.

    ``shard_ids`` are the shards this run produced, ``reused_shards`` those it found complete
    (a shard-range backfill); both are read from ``outputs_store``, the prompt manifest from
    ``run_store``. ``launch`` is the launch_servers XCom; ``generate_results`` (for
    ejections) defaults to the ``generation`` entry of each shard's generated manifest;
    ``settings_fingerprint`` (of the settings that shape completions) goes into the report
    and the dataset card (see ``write_cards``). Never raises for broken gates: the summary
    says ``passed`` and ``raise_for_gates`` fails the task. Files are written create-only,
    ``report.json`` last, and are byte-identical when rebuilt from the same inputs, so a
    retried report task succeeds.
    """
    gates = gates or QualityGates.from_settings(settings)
    manifest = read_json(run_store, MANIFEST_KEY)
    if manifest is None:
        raise FileNotFoundError(f"{run_store.uri(MANIFEST_KEY)} does not exist")
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
                            gates=gates, launch=launch, generate_results=generate_results,
                            settings_fingerprint=settings_fingerprint)
    report["held_out_answers"] = held_out_answers(outputs_store)
    publish = report["passed"] and dataset_complete(manifest, shards)
    report["trainer_export"] = write_run_export(
        outputs_store, [s.shard_id for s in shards if s.tokenized], publish=publish)
    prefix = report_prefix(run_id)
    report["report_uri"] = outputs_store.uri(prefix + REPORT_HTML)
    files: dict[str, bytes] = {}
    if plots:
        from include.reporting.plots import render_plots

        plots_data = render_plots(report, raw_lengths(shards))
        files.update({prefix + name: data for name, data in plots_data.items()})
    report["plots"] = sorted(k[len(prefix):] for k in files)
    from include.reporting.render import render_html, render_markdown

    files[prefix + REPORT_MARKDOWN] = render_markdown(report).encode()
    files[prefix + REPORT_HTML] = render_html(report).encode()
    for key, data in files.items():
        outputs_store.write_new(key, data)
    report["dataset_card"] = write_cards(outputs_store, report, manifest, settings,
                                         publish=publish)
    data = (json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    outputs_store.write_new(prefix + REPORT_JSON, data)
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
        "tokenized": {k: tok[k] for k in ("written", "quarantined", "filtered", "dropped",
                                          "tokens", "loss_tokens")},
        "dataset_card": report.get("dataset_card"),
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
        f"loss), {t['quarantined']} quarantined ({t['filtered']} by the quality filters), "
        f"{t['dropped']} dropped",
        *("  " + gate["message"] for gate in summary["gates"]),
        f"  report: {summary['report_uri']}",
    ]
    if not summary["consistency_ok"]:
        lines.append("  WARNING: manifests and journals disagree; see consistency in report.json")
    return "\n".join(lines)
