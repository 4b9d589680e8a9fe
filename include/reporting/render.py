"""Render a report as Markdown and as a standalone HTML page (same sections, same numbers)."""

from __future__ import annotations

import html
import re
from typing import Any

from include.layout import CARD_NAME  # a copy is in each report folder: a relative link opens it
from include.reporting.throughput import describe_server_time

Block = tuple[str, Any]


def _reasons(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "-" if v is None else str(v)


#: What each gate's figure counts: "0 0 pass" said nothing (issue 34).
GATE_MEANINGS = {
    "max_truncation_rate": "share of completions cut short by max_tokens (truncated/completed)",
    "max_failure_rate": "share of prompts sent that failed (failed/sent)",
    "min_completions_per_source": "completions of the source with the fewest",
    "max_quarantine_rate": "share of checked completions quarantined by the tokenization "
                           "checks (quarantined/checked)",
    "max_filtered_rate": "share of checked completions kept out by the output quality filters "
                         "(filtered/checked)",
    "all_shards_complete": "shards of the run with no generated or tokenized output",
}


#: The name of the one tokens/s figure, on the report and on the monitor (include/monitor).
TOKENS_PER_S = "tokens/s while generating"


def _generating_s(tp: dict[str, Any]) -> float:
    return tp.get("generating_s", tp["wall_s"])  # a report made before generating_s: the wall


def _measured(gate: dict[str, Any]) -> str:
    ratio = (f" ({gate['numerator']:,}/{gate['denominator']:,})"
             if gate.get("denominator") is not None else "")
    return _fmt(gate["measured"]) + ratio


def _allowed(gate: dict[str, Any]) -> str:
    if gate["name"].startswith("min_"):
        return f"at least {_fmt(gate['threshold'])}" if gate["threshold"] else "no minimum"
    return f"at most {_fmt(gate['threshold'])}"


def blocks(report: dict[str, Any]) -> list[Block]:
    """Return the report as a list of ``(kind, content)`` blocks: h1/h2/p/table/img."""
    run, shards = report["run"], report["shards"]
    out: list[Block] = [
        ("h1", f"Run report: {run['run_name']} ({run['airflow_run_id']})"),
        ("p", f"**{'PASSED' if report['passed'] else 'FAILED'}** quality gates. Outputs: "
              f"`{run['outputs_uri']}`. Shards: {len(shards['produced'])} produced, "
              f"{len(shards['reused'])} reused as already complete, {shards['in_run']} in the "
              f"run (shard_range: {run['shard_range'] or 'all'}). Servers: model "
              f"{', '.join(report['servers']['models']) or '-'}, context length "
              f"{report['servers']['context_length']} (from "
              f"{report['servers']['context_length_from']})."),
        ("p", f"Dataset card: [{CARD_NAME}]({CARD_NAME}), beside this report: what the data "
              "is, and how to train on it."),
        ("h2", "Quality gates"),
        ("table", (["gate", "what is measured", "measured", "allowed", "result",
                    "top contributors"],
                   [[g["name"], GATE_MEANINGS.get(g["name"], "-"), _measured(g), _allowed(g),
                     "pass" if g["passed"] else "FAIL",
                     ", ".join(f"{c['name']} ({c['count']})" for c in g["contributors"]) or "-"]
                    for g in report["gates"]])),
        ("h2", "Funnel per source"),
    ]
    f = report["funnel"]
    srcs = sorted(set(f["prepare"]) | set(f["generation"]) | set(f["tokenization"]))
    rows = []
    for s in srcs:
        p, g, t = f["prepare"].get(s, {}), f["generation"].get(s, {}), f["tokenization"].get(s, {})
        rows.append([s, _fmt(p.get("read")), _fmt(p.get("kept")),
                     _reasons(p.get("dropped", {})), _fmt(g.get("sent", 0)),
                     _fmt(g.get("completed", 0)), _fmt(g.get("truncated", 0)),
                     _reasons(g.get("skipped_by_reason", {})),
                     _reasons(g.get("failed_by_reason", {})), _fmt(t.get("written", 0)),
                     _reasons({**t.get("quarantined_by_reason", {}),
                               **t.get("dropped_by_reason", {})})])
    out.append(("table", (["source", "read", "kept", "dropped (prepare)", "sent", "completed",
                           "truncated", "skipped", "failed", "tokenized",
                           "quarantined/dropped (tokenize)"], rows)))
    gt, tt = report["generation"]["totals"], report["tokenization"]["totals"]
    out.append(("p", f"Totals (from the shard manifests): {gt['prompts']:,} prompts, "
                     f"{gt['sent']:,} sent, {gt['completed']:,} completed, {gt['truncated']:,} "
                     f"truncated, {gt['skipped']:,} skipped, {gt['failed']:,} failed; "
                     f"{tt['written']:,} tokenized samples, {tt['quarantined']:,} quarantined "
                     f"({_reasons(tt['quarantined_by_reason'])}; {tt['filtered']:,} of them by "
                     f"the output quality filters), {tt['dropped']:,} dropped "
                     f"({_reasons(tt['dropped_by_reason'])})."))
    out += quality_filter_blocks(report["quality_filters"])
    if report.get("conversations"):
        out += conversation_blocks(report["conversations"])
    if report.get("variants"):
        out += variant_blocks(report["variants"])
    tp = report["throughput"]
    tok = report["tokens"]
    out += [
        ("h2", "Tokens and throughput"),
        ("p", f"Prompt tokens {tok['prompt_tokens']:,}, completion tokens "
              f"{tok['completion_tokens']:,}; tokenized set {tt['tokens']:,} tokens "
              f"({tt['loss_tokens']:,} in the loss). This run's shards: "
              f"{tp['output_tokens']:,} output tokens in {_generating_s(tp):,.1f} s of "
              f"generation = **{tp['output_tokens_per_s']:,.1f} {TOKENS_PER_S}** (the "
              f"monitor's figure: shards generating side by side counted once, the time "
              f"between shards not counted; wall clock, first request to last answer: "
              f"{tp['wall_s']:,.1f} s). Retries: {tp['retries']['extra_attempts']} extra "
              f"attempts on {tp['retries']['prompts_retried']} prompts (a conversation's "
              "later turns are no retries)."),
        # The plot's legend gives the same shares (server_time_shares): one basis for both.
        ("p", describe_server_time(tp)),
        ("img", "throughput.png"),
    ]
    ej = report["servers"]["ejections"]
    out.append(("table", (["server", "completed", "output tokens", TOKENS_PER_S, "idle tail s",
                           "ejections"],
                          [[srv, _fmt(v["completed"]), _fmt(v["output_tokens"]),
                            _fmt(v["output_tokens_per_s"]), _fmt(v["idle_tail_s"]),
                            _fmt(ej.get(srv, 0)) if ej is not None else "not recorded"]
                           for srv, v in tp["per_server"].items()])))
    dr = tp["drains"]
    if dr.get("per_shard"):
        out.append(("p", f"Drains: the run's last request started {dr['run_drain_s']:.1f} s "
                         f"before the end; servers waited {dr['idle_server_seconds']:.1f} "
                         "server-seconds for it (part of the idle time above). Per shard "
                         "(last start to last finish): "
                         + ", ".join(f"{k} {v['drain_s']:.1f}s"
                                     for k, v in dr["per_shard"].items()) + "."))
    out += [("h2", "Lengths per source (tokens)")]
    rows = []
    for src, v in report["lengths"].items():
        tl = report["tokenized_lengths"].get(src, {})
        rows.append([src] + [_fmt(v[k][q]) for k in ("prompt_tokens", "completion_tokens")
                             for q in ("mean", "p50", "p90", "max")]
                    + [_fmt(tl.get(q)) for q in ("count", "mean", "p50", "p90", "p99", "max")])
    out.append(("table", (["source", "prompt mean", "p50", "p90", "max", "completion mean",
                           "p50", "p90", "max", "tokenized n", "mean", "p50", "p90", "p99",
                           "max"], rows)))
    out += [("img", "prompt_tokens.png"), ("img", "completion_tokens.png"),
            ("img", "tokenized_length.png")]
    out += trainer_blocks(report)
    if shards.get("regenerated"):
        out.append(("table", (["regenerated shard (force_regenerate)", "why"],
                              [[r["shard"], r["reason"] or "-"] for r in shards["regenerated"]])))
    if shards["reused"] or shards["missing_outputs"]:
        out.append(("p", f"Reused shards: {', '.join(shards['reused']) or '-'}. Shards missing "
                         f"outputs: {', '.join(shards['missing_outputs']) or '-'}."))
    bad = [c for c in report["consistency"] if not c["ok"]]
    out.append(("p", "Consistency between manifests, journals and parquet: "
                     + ("all checks agree." if not bad else
                        "; ".join(f"{c['check']}: {c['left']} != {c['right']}" for c in bad))))
    out.append(("p", "Each figure's single source of truth is listed in report.json under "
                     "`sources_of_truth`."))
    return [b for b in out if b[0] != "img" or b[1] in report.get("plots", [])]


def trainer_blocks(report: dict[str, Any]) -> list[Block]:
    """Return the trainer export's section: where it is, what it holds, what the card says."""
    export, figures = report.get("trainer_export") or {}, report.get("trainers") or {}
    if not export:
        return []
    where = (f"`{export['uri']}` ({export['bytes']:,} bytes from {export['shards']} shards, "
             f"sha256 `{export['sha256']}`)" if export.get("written")
             else f"`{export['uri']}`: {export.get('reason')}")
    return [("h2", "Trainer export"),
            ("p", f"The whole run for SpecForge's `data.prompts_path`: {where}. Per shard, for "
                  f"speculators' `prepare-data --data`: `{export['folder_uri']}`. Longest row "
                  f"{_fmt(figures.get('longest_row'))} tokens (the trainers' `max_length`). "
                  f"The [dataset card]({CARD_NAME}) says how to train on it.")]


def quality_filter_blocks(qf: dict[str, Any]) -> list[Block]:
    """Return the output quality filters' section: counts per filter and per source."""
    sources = sorted(qf["per_source"])
    off = ", ".join(qf["off"]) or "none"
    rows = [[name, "off" if f["off"] else "on", _fmt(f["quarantined"])]
            + [_fmt(qf["per_source"][src].get(name, 0)) for src in sources]
            for name, f in qf["filters"].items()]
    return [
        ("h2", "Output quality filters"),
        ("p", f"{qf['filtered']:,} of {qf['checked']:,} completions checked were quarantined "
              "by the output quality filters (gate `max_filtered_rate`; the other quarantines "
              f"count against `max_quarantine_rate`). Filters off (`quality_filters_off`): "
              f"{off}."),
        ("table", (["filter", "ran", "quarantined", *sources], rows)),
    ]


def variant_blocks(variants: dict[str, Any]) -> list[Block]:
    """Return the mixed-sampling section: lengths and filters per variant."""
    rows = [[name, _fmt(v["completed"]), _fmt(v["truncated"]),
             _fmt(v["prompt_tokens"].get("mean")), _fmt(v["completion_tokens"].get("mean")),
             _fmt(v["completion_tokens"].get("p90")), _reasons(v["filtered"]) or "-"]
            for name, v in variants.items()]
    return [("h2", "Sampling variants"),
            ("table", (["variant", "completed", "truncated", "prompt mean", "completion mean",
                        "completion p90", "quality filters"], rows))]


def conversation_blocks(conv: dict[str, Any]) -> list[Block]:
    """Return the whole conversations' section (``turns: all``)."""
    rows = conv["whole_rows"] + conv["turn_rows"]
    return [
        ("h2", "Whole conversations"),
        ("p", f"{conv['conversations']:,} conversations, {conv['turns']:,} target turns; "
              f"{rows:,} rows from them: {conv['whole_rows']:,} whole-conversation rows (one "
              "sequence, prefix-stable token by token) and "
              f"{conv['turn_rows']:,} per-turn rows. Kept apart (per-turn rows), by reason: "
              f"{_reasons(conv['kept_apart'])}."),
        ("table", (["conversations ended by", "count"],
                   [[r, _fmt(n)] for r, n in conv["ends"].items()])),
        ("p", "Example difference (why a conversation was not prefix-stable): "
              + (f"`{conv['example_difference']}`" if conv["example_difference"] else "none.")),
    ]


def render_markdown(report: dict[str, Any]) -> str:
    """Return the report as Markdown (images referenced by relative file name)."""
    lines: list[str] = []
    for kind, content in blocks(report):
        if kind == "h1":
            lines += [f"# {content}", ""]
        elif kind == "h2":
            lines += [f"## {content}", ""]
        elif kind == "p":
            lines += [content, ""]
        elif kind == "img":
            lines += [f"![{content}]({content})", ""]
        else:
            head, rows = content
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            lines.append("")
    return "\n".join(lines)


#: A Markdown link to a file beside the report (a plain name: nothing else is linked).
_LINK = re.compile(r"\[([^\]\[]+)\]\(([A-Za-z0-9_.-]+)\)")


def _inline(text: str) -> str:
    # The only inline markup the blocks use: **bold**, `code` and [text](file beside it).
    parts = html.escape(text).split("**")
    text = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
    text = _LINK.sub(r"<a href='\2'>\1</a>", text)
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render_html(report: dict[str, Any]) -> str:
    """Return the report as one HTML page (images referenced by relative file name)."""
    body: list[str] = []
    for kind, content in blocks(report):
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{html.escape(content)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_inline(content)}</p>")
        elif kind == "img":
            body.append(f'<img src="{html.escape(content)}" alt="{html.escape(content)}">')
        else:
            head, rows = content
            body.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
                        + "</tr>" + "".join("<tr>" + "".join(
                            f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                        + "</table>")
    # Light or dark as the reader's system is (the Airflow UI follows it too): the browser's
    # own colours for each, borders that show on both, plots on white (they are drawn so).
    style = (":root{color-scheme:light dark}"
             "body{font-family:sans-serif;margin:1.5em;max-width:1400px}"
             "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
             "td,th{border:1px solid #8888;padding:2px 6px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}"
             "img{max-width:100%;background:#fff}"
             "@media (prefers-color-scheme:dark){body{background:#16181d;color:#e3e5e8}"
             "a{color:#8ab4f8}code{color:#f0c674}}")
    title = html.escape(f"Report {report['run']['run_name']}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
