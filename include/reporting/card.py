"""The dataset card: ``<run>/README.md`` in the Hugging Face dataset-card format.

A pure function of what the run already recorded (the report, the prompt manifest, the run
settings, and what the servers said about themselves), so a training team reading the
dataset a month later can tell which model revision wrote it, with which sampling, from
which sources under which licences, and what was filtered out. Nothing here reads a file;
a figure the inputs do not hold is written as "not reported", never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from include.layout import CONVERSATIONS_GLOB, TOKENIZED_PARQUET_GLOB
from include.reporting.trainers import training_lines

#: The card's ``data_files``: the tokenized shards, relative to the card (the run's outputs).
DATA_FILES = TOKENIZED_PARQUET_GLOB
NOT_REPORTED = "not reported"
#: Stands where the settings fingerprint goes until the run records one.
FINGERPRINT_PLACEHOLDER = "NOT RECORDED (placeholder: the run does not record one yet)"

#: What the project knows of each source kind: hub id, licence (SPDX-style id as the hub
#: card gives it, None when unknown) and why. Check the card at the revision you read.
KNOWN_SOURCES: dict[str, dict[str, Any]] = {
    "infinity_instruct": {"hub_id": "BAAI/Infinity-Instruct", "license": "cc-by-sa-4.0",
                          "note": "gated on the hub"},
    "webinstructsub": {"hub_id": "TIGER-Lab/WebInstructSub", "license": None,
                       "note": "rows whose `source` is `socratic` (~533k) are CC BY-NC 4.0: "
                               "exclude them with exclude_sources: [socratic]"},
    "codefeedback": {"hub_id": "m-a-p/CodeFeedback-Filtered-Instruction", "license": None,
                     "note": ""},
    "metamathqa": {"hub_id": "meta-math/MetaMathQA", "license": "mit",
                   "note": "the hub card's licence changed over its history"},
    "hermes_function_calling": {"hub_id": "NousResearch/hermes-function-calling-v1",
                                "license": "apache-2.0", "note": ""},
    "agentinstruct": {"hub_id": "THUDM/AgentInstruct", "license": None, "note": ""},
    "orca_agentinstruct": {"hub_id": "microsoft/orca-agentinstruct-1M-v1", "license": None,
                           "note": ""},
    "agent_flan": {"hub_id": "internlm/Agent-FLAN", "license": None, "note": ""},
}
#: Hugging Face's size buckets: (upper bound exclusive, label).
SIZE_BUCKETS = ((10**3, "n<1K"), (10**4, "1K<n<10K"), (10**5, "10K<n<100K"),
                (10**6, "100K<n<1M"), (10**7, "1M<n<10M"), (10**8, "10M<n<100M"),
                (10**9, "100M<n<1B"), (10**10, "1B<n<10B"), (10**11, "10B<n<100B"),
                (10**12, "100B<n<1T"))


def size_category(rows: int) -> str:
    """Return Hugging Face's ``size_categories`` bucket of ``rows`` (1,000 is ``1K<n<10K``)."""
    for bound, label in SIZE_BUCKETS:
        if rows < bound:
            return label
    return "n>1T"


def sources_used(report: dict[str, Any], manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Return each source with rows in the dataset: name, kind, hub id, licence, rows kept.

    A source is used when at least one of its rows was tokenized; its kind comes from the
    prompt manifest (the prepare stage records it), its licence from ``KNOWN_SOURCES``.
    """
    written = report["funnel"]["tokenization"]
    configured = {s["name"]: s for s in
                  (manifest.get("preparation_settings") or {}).get("sources") or []}
    out = []
    for name, facts in manifest["sources"].items():
        rows = written.get(name, {}).get("written", 0)
        if not rows:
            continue
        kind = facts.get("kind") or (configured.get(name) or {}).get("kind") or ""
        known = KNOWN_SOURCES.get(kind, {})
        conf = configured.get(name) or {}
        out.append({
            "name": name, "kind": kind, "rows": rows,
            "hub_id": conf.get("hub_id") or known.get("hub_id"),
            "license": known.get("license"), "note": known.get("note", ""),
            "excluded_values": conf.get("exclude_sources") if conf else None,
            "filtered_source": facts.get("dropped", {}).get("filtered_source", 0),
        })
    return out


def card_header(report: dict[str, Any], used: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the card's YAML header as data (configs, licences, task and size categories)."""
    rows = report["tokenization"]["totals"]["written"]
    licenses = sorted({s["license"] for s in used if s["license"]})
    if any(not s["license"] for s in used) or not used:
        licenses.append("other")
    return {
        "configs": [{"config_name": "default",
                     "data_files": [{"split": "train", "path": DATA_FILES}]}],
        "license": licenses if len(licenses) > 1 else licenses[0],
        "task_categories": ["text-generation"],
        "size_categories": [size_category(rows)],
        "tags": ["speculative-decoding", "drafter-training", "synthetic", "regenerated"],
        "dataset_info": {"splits": [{"name": "train", "num_examples": rows}]},
    }


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(_cell(c) for c in r) + " |" for r in rows), ""]


def _cell(v: Any) -> str:
    if v is None:
        return NOT_REPORTED
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v).replace("|", "\\|")


def _reasons(d: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in d.items() if v) or "-"


def _model_lines(report: dict[str, Any], settings: Mapping[str, Any],
                 servers: Sequence[Mapping[str, Any]] | None) -> list[str]:
    served = settings.get("served_model_name") or settings.get("model_path")
    answered = ", ".join(report["servers"]["models"]) or NOT_REPORTED
    lines = ["## Target model", "",
             f"- Model path: `{settings.get('model_path') or NOT_REPORTED}`",
             f"- Served model name: `{served}` (the servers answered as: {answered})",
             f"- Context length: {report['servers']['context_length']:,} (from "
             f"{report['servers']['context_length_from']})", ""]
    if not servers:
        lines += ["SGLang version and `weight_version` per server: not reported.", ""]
        return lines
    lines += _table(["server", "served model", "SGLang version", "weight_version"],
                    [[s.get("url"), s.get("model"), s.get("version"), s.get("weight_version")]
                     for s in servers])
    return lines


#: The run settings that shape a completion (sampling) and a row (tokenization).
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "enable_thinking",
                 "reasoning_parser", "min_completion_tokens", "context_margin", "turns")
TOKENIZATION_KEYS = ("include_reasoning", "keep_truncated_completions", "max_sequence_length",
                     "over_length")


def _turns(settings: Mapping[str, Any]) -> Any:
    """Return the run's ``turns``, and the sources that set their own (``sources[].turns``)."""
    run = settings.get("turns")
    own = {}
    for s in settings.get("sources") or ():
        if isinstance(s, Mapping) and s.get("turns") and s.get("turns") != run:
            own.setdefault(s["turns"], []).append(str(s.get("name")))
    if run is None or not own:
        return run
    return "; ".join([str(run), *(f"{t} for {', '.join(names)}" for t, names in own.items())])


def _sampling_lines(settings: Mapping[str, Any]) -> list[str]:
    variants = {k: v for k, v in (settings.get("sampling_variants") or {}).items() if v}
    mixed = (["Mixed sampling (`sampling_variants`): each prompt drew one value of each of "
              + ", ".join(f"`{k}` {v}" for k, v in variants.items())
              + " (by seed, per setting); the values above are the others'. Each row records "
              "its own in `sampling_variant` and the `sampling_*` columns.", ""]
             if variants else [])
    return ["## Sampling", "",
            *_table(["setting", "value"], [[k, _turns(settings) if k == "turns"
                                             else settings.get(k)] for k in SAMPLING_KEYS]),
            *mixed,
            "Each request's `max_tokens` is min(max_tokens, context length - prompt tokens - "
            "context_margin).", "",
            *_table(["tokenization setting", "value"],
                    [[k, settings.get(k)] for k in TOKENIZATION_KEYS])]


def _conversation_lines(conv: Mapping[str, Any] | None) -> list[str]:
    """Return the whole-conversations section (``turns: all``); none for single answers."""
    if not conv:
        return []
    ends = ", ".join(f"{r} {n:,}" for r, n in conv.get("ends", {}).items() if n) or "-"
    apart = ", ".join(f"{r} {n:,}" for r, n in conv.get("kept_apart", {}).items() if n) or "-"
    return ["## Whole conversations", "",
            f"{conv.get('conversations', 0):,} conversations regenerated turn by turn "
            f"({conv.get('turns', 0):,} target turns; every assistant turn is the target's, "
            "a recorded tool result follows only a turn that made the same calls). Ended by: "
            f"{ends}. Rows: {conv.get('whole_rows', 0):,} whole-conversation rows (the loss on "
            f"every target turn) where the turns are prefix-stable, "
            f"{conv.get('turn_rows', 0):,} per-turn rows (`id` `<conversation>#turn-<k>`) "
            f"elsewhere ({apart}).", ""]


def _source_lines(used: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in used:
        excluded = (", ".join(s["excluded_values"]) if s["excluded_values"]
                    else "none" if s["excluded_values"] is not None else NOT_REPORTED)
        rows.append([s["name"], s["hub_id"] or "local files", s["rows"],
                     s["license"] or "unknown: check the dataset's card",
                     f"{excluded} ({s['filtered_source']:,} rows dropped)", s["note"] or "-"])
    return ["## Sources", "", *_table(
        ["source", "dataset", "rows", "licence", "excluded source values", "note"], rows),
        "Licences as the project records them; the licence of each source applies to the "
        "prompts taken from it. `other` in the header: a source whose licence is not recorded "
        "here.", ""]


def _funnel_lines(report: dict[str, Any]) -> list[str]:
    f = report["funnel"]
    rows = []
    for src in sorted(set(f["prepare"]) | set(f["generation"]) | set(f["tokenization"])):
        p, g, t = f["prepare"].get(src, {}), f["generation"].get(src, {}), \
            f["tokenization"].get(src, {})
        rows.append([src, p.get("read"), p.get("kept"), _reasons(p.get("dropped", {})),
                     g.get("completed", 0), _reasons(g.get("skipped_by_reason", {})),
                     _reasons(g.get("failed_by_reason", {})), t.get("written", 0),
                     _reasons(t.get("quarantined_by_reason", {})),
                     _reasons(t.get("dropped_by_reason", {}))])
    tt = report["tokenization"]["totals"]
    return ["## Funnel and filters", "", *_table(
        ["source", "read", "kept", "dropped at preparation", "completed", "skipped", "failed",
         "rows", "quarantined", "dropped at tokenization"], rows),
        f"Tokenization: {tt['input']:,} completions in, {tt['written']:,} rows written, "
        f"{tt['quarantined']:,} quarantined ({_reasons(tt['quarantined_by_reason'])}), "
        f"{tt['dropped']:,} dropped ({_reasons(tt['dropped_by_reason'])}), "
        f"{tt['truncated_to_max_length']:,} truncated to the maximum length.", ""]


def _held_out_line(prompts_manifest: Mapping[str, Any],
                   answers: Mapping[str, Any] | None) -> str:
    held = prompts_manifest.get("held_out") or {}
    if not held.get("count"):
        return ("- Held-out split: none (`held_out_per_source` 0, or sources too small); "
                "a drafter trained on this run cannot be measured on its own data")
    per = ", ".join(f"{s} {n:,}" for s, n in held.get("per_source", {}).items())
    answered = (f"the target's answers, {answers['rows']:,} rows from {answers['prompts']:,} "
                f"prompts, made as the training rows are: `{answers['parquet']}`, and for a "
                f"trainer's validation set `{answers['pretokenized']}`" if answers else
                "the target's answers: not generated yet (a whole run without `shard_range` "
                "answers them)")
    return (f"- Held-out split: {held['count']:,} prompts ({per}) in `{held['key']}`, in no "
            f"training export; {answered}. Measure drafters on them with the "
            "`evaluate_drafter` DAG; each evaluation's report and \"measured value\" section "
            "land in `eval/evaluations/<airflow run id>/` (`report.md`, `card-section.md`)")


def _text_rule_lines(prompts_manifest: Mapping[str, Any]) -> list[str]:
    """What the prepare stage did with dataset text the target would misread, and how often."""
    sources = prompts_manifest.get("sources", {})

    def count(reason: str) -> int:
        return sum(s.get("dropped", {}).get(reason, 0) for s in sources.values())

    control = prompts_manifest.get("control_tokens") or {}
    if "tokens" in control:
        rule = (f"{count('control_token'):,} rows dropped (`control_token`): a turn held the "
                "string of one of the target tokenizer's "
                f"{len(control['tokens'])} added tokens, which the server would read as that "
                "token (a forged end of turn or assistant header). User turns may hold none; "
                "system, assistant and tool turns may hold the chat template's own markup ("
                + (", ".join(f"`{t}`" for t in control["markup_outside_user_turns"]) or "none")
                + "), where it gives the ids the template gives.")
    else:
        rule = ("Control tokens: NOT checked, the target's tokenizer did not load at "
                f"preparation ({control.get('unchecked', NOT_REPORTED)}).")
    return ["### Hostile text", "", rule, "",
            f"{count('malformed'):,} rows dropped as `malformed` (among them text, ids or "
            "metadata holding invalid unicode); "
            f"{count('empty'):,} as `empty` (a prompt or user turn of white space or invisible "
            "characters only). JSONL lines escape U+2028, U+2029 and U+0085, so every line "
            "splitter reads one record a line.", ""]


def _token_lines(report: dict[str, Any]) -> list[str]:
    tok, tt = report["tokens"], report["tokenization"]["totals"]

    def reasoning(d: Mapping[str, Any]) -> Any:
        return d.get("reasoning_tokens", NOT_REPORTED)

    rows = [[src, v["prompt_tokens"], v["completion_tokens"], reasoning(v)]
            for src, v in tok["per_source"].items()]
    rows.append(["all", tok["prompt_tokens"], tok["completion_tokens"], reasoning(tok)])
    missing = (" Reasoning tokens are the servers' own count of the ids in the think block "
               "(`usage.reasoning_tokens`)." if "reasoning_tokens" in tok else
               " Reasoning tokens: not reported (a server older than SGLang 0.5.23 does not "
               "count them in `usage.reasoning_tokens`).")
    return ["## Tokens", "", *_table(
        ["source", "prompt tokens", "completion tokens", "reasoning tokens"], rows),
        "Prompt and completion tokens are the servers' usage counts of every completed "
        f"request. The tokenized rows hold {tt['tokens']:,} tokens, {tt['loss_tokens']:,} of "
        f"them in the loss (`loss_mask` 1).{missing}", ""]


def _load_lines() -> list[str]:
    return ["## Loading", "", "```python", "import datasets", "",
            f'ds = datasets.load_dataset("parquet", data_files="{DATA_FILES}", split="train")',
            "```", "",
            "Paths are relative to this card's folder (the run's outputs). Columns: "
            "`input_ids` (the prompt ids and the ids the target sampled, as its server "
            "returned them), `loss_mask` (1 on the sampled ids), `length`, `source`, `id` "
            "(`<source>:<config>:<row>`), `finish_reason`, `token_source`, and the provenance "
            "columns. The same rows for trainers: `pretokenized.jsonl` and `pretokenized/` "
            "(above). Conversations, re-tokenized by whoever reads them, are beside each shard "
            f"(`{CONVERSATIONS_GLOB}`).",
            ""]


def render_card(
    report: dict[str, Any],
    prompts_manifest: dict[str, Any],
    settings: Mapping[str, Any],
    *,
    servers: Sequence[Mapping[str, Any]] | None = None,
    settings_fingerprint: str | None = None,
) -> str:
    """Return the dataset card (``README.md`` text) of a run.

    ``report`` is ``compute_report``'s data; ``prompts_manifest`` the run's
    ``prompts/manifest.json``; ``settings`` ``RunSettings.to_dict()``; ``servers`` what each
    server reported about itself (``url``, ``model``, ``version``, ``weight_version``, e.g.
    preflight's results), "not reported" when absent; ``settings_fingerprint`` (else the
    report's, else a placeholder).
    """
    used = sources_used(report, prompts_manifest)
    header = yaml.safe_dump(card_header(report, used), sort_keys=False, allow_unicode=True)
    run = report["run"]
    fingerprint = settings_fingerprint or report.get("settings_fingerprint")
    gt = report["generation"]["totals"]
    lines = [
        "---", header.rstrip("\n"), "---", "",
        f"# {run['run_name']}: drafter training data regenerated by "
        f"{settings.get('served_model_name') or settings.get('model_path')}", "",
        "Prompts from the sources below, answered by the target model itself on SGLang; each "
        "row is the prompt ids and the ids the target sampled, as its server returned them, "
        "for training a speculative-decoding drafter.", "",
        f"- Rows: {report['tokenization']['totals']['written']:,} "
        f"({gt['completed']:,} completions of {gt['prompts']:,} prompts)",
        f"- Airflow run: `{run['airflow_run_id']}`; outputs `{run['outputs_uri']}`",
        f"- Shards: {len(report['shards']['produced'])} produced by this run, "
        f"{len(report['shards']['reused'])} reused, {report['shards']['in_run']} in the run; "
        f"missing outputs: {', '.join(report['shards']['missing_outputs']) or 'none'}",
        f"- Preparation fingerprint: "
        f"`{prompts_manifest.get('preparation_fingerprint') or NOT_REPORTED}`",
        f"- Settings fingerprint: `{fingerprint or FINGERPRINT_PLACEHOLDER}`",
        f"- Quality gates: {'passed' if report['passed'] else 'FAILED'}",
        _held_out_line(prompts_manifest, report.get("held_out_answers")), "",
        *_model_lines(report, settings, servers),
        *_sampling_lines(settings),
        *_source_lines(used),
        *_funnel_lines(report),
        *_text_rule_lines(prompts_manifest),
        *_conversation_lines(report.get("conversations")),
        *_token_lines(report),
        *training_lines(report.get("trainer_export") or {}, report.get("trainers") or {},
                        str(settings.get("model_path") or "<target model>"),
                        report.get("conversations")),
        *_load_lines(),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
