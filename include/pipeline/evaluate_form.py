"""``evaluate_drafter``'s trigger form: one typed ``Param`` per field of ``EvaluationRequest``.

Read when the DAG file is parsed, so only pydantic's schema of the request (no stage, no
network); the default model is the deployment's first allowed one, as in the main DAG's form.
Drafters and prompt sets are names the deployment resolves (``REGEN_ALLOWED_DRAFTERS``,
``REGEN_ALLOWED_PROMPT_SETS``); no field is a path.
"""

from __future__ import annotations

from typing import Any

_TEXT: dict[str, tuple[str, str, str]] = {  # name: (section, title, description)
    "dataset_run": ("Dataset", "Dataset run", "Run name under the output root whose held-out "
                    "split is measured; empty: the dataset Asset's latest event."),
    "prompt_sets": ("Dataset", "Named prompt sets", "Names of REGEN_ALLOWED_PROMPT_SETS "
                    "(e.g. MT-Bench, GSM8K, HumanEval files the deployment lists) measured "
                    "beside the held-out split, each reported as its own source; empty: none."),
    "baseline": ("Drafters", "Baseline drafter", "A drafter name of REGEN_ALLOWED_DRAFTERS."),
    "candidates": ("Drafters", "Candidate drafters", "Drafter names of "
                   "REGEN_ALLOWED_DRAFTERS, each compared with the baseline."),
    "algorithm": ("Speculative decoding", "Algorithm", "--speculative-algorithm."),
    "num_steps": ("Speculative decoding", "Steps", "--speculative-num-steps; empty: SGLang's."),
    "eagle_topk": ("Speculative decoding", "Top-k", "--speculative-eagle-topk; empty: SGLang's."),
    "num_draft_tokens": ("Speculative decoding", "Draft tokens",
                         "--speculative-num-draft-tokens; empty: SGLang's."),
    "temperatures": ("Requests", "Temperatures", "Each temperature is a pass of the split."),
    "thinking": ("Requests", "Thinking", "Thinking on, off, or both (a pass each)."),
    "max_tokens": ("Requests", "Max tokens", "Longest answer per request."),
    "concurrency": ("Requests", "In flight per server", "Requests in flight per server."),
    "target_only_pass": ("Requests", "Target-only pass",
                         "Measure the target alone too (the speedup's denominator)."),
    "min_gain": ("Gate", "Minimum gain", "Fail the run when a candidate's acceptance length "
                 "gain over the baseline (pooled over sources) is below this; empty: no gate."),
    "seed": ("Gate", "Seed", "Seed of the bootstrap intervals."),
    "model_path": ("Servers", "Model path", "The target (one of REGEN_ALLOWED_MODELS): the "
                   "dataset run's."),
    "served_model_name": ("Servers", "Served model name", "As the dataset run's servers."),
    "context_length": ("Servers", "Context length", "As the dataset run's servers."),
    "tp_size": ("Servers", "Tensor parallel size", "GPUs per server."),
    "mem_fraction_static": ("Servers", "Memory fraction", "--mem-fraction-static."),
    "reasoning_parser": ("Servers", "Reasoning parser", "As the dataset run's servers."),
    "launch_timeout_s": ("Servers", "Launch timeout (s)", "How long the gate waits."),
}
_KEYS = ("type", "enum", "pattern", "items", "minItems", "maxItems", "minimum", "maximum")


def _schema(prop: dict[str, Any]) -> dict[str, Any]:
    variants = prop.get("anyOf")
    if variants:  # Optional[X]: X or null, an emptied field being the default
        inner = next(v for v in variants if v.get("type") != "null")
        prop = {**prop, **inner, "type": [inner["type"], "null"]}
        if "enum" in inner:
            prop["enum"] = [*inner["enum"], None]
    schema = {k: prop[k] for k in _KEYS if k in prop}
    bounds = {k: schema.pop(k) for k in ("minimum", "maximum") if k in schema}
    if bounds:  # as the main form: the trigger refuses, the field does not clamp (issue 34)
        schema["allOf"] = [bounds]
    return schema


def airflow_params() -> dict[str, Any]:
    """The form: every field typed, in the order of ``_TEXT``."""
    from airflow.sdk import Param

    from include.evaluation.settings import EvaluationRequest
    from include.settings.deployment import DeploymentSettings

    props = EvaluationRequest.model_json_schema()["properties"]
    defaults = {"model_path": DeploymentSettings.parse_time_values().allowed_models[0],
                "baseline": "", "candidates": []}
    params = {}
    for name, (section, title, text) in _TEXT.items():
        prop = props[name]
        default = defaults.get(name, prop.get("default"))
        params[name] = Param(default, title=title, description=text, section=section,
                             **_schema(prop))
    return params
