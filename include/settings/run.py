"""Run settings: what one run does. The trigger form, ``dags trigger -c`` and REST set them.

Every setting has one name, used unchanged in the trigger form (``Param`` keys), in
``airflow dags trigger -c`` JSON, in code (``RunSettings`` attributes), in logs and in the docs.
Nothing here names a host, a command, a credential or a protected location: those are
deployment settings (``include/settings/deployment.py``), which a run cannot set.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from include.settings.fields import (
    NAME_PATTERN,
    REPO_ROOT,
    SAMPLE_DATA_DIR,
    SHARD_RANGE_PATTERN,
    QualityFilter,
    SourceSettings,
)

# The shared names stay importable from here too (``include.settings`` imports them so).
__all__ = ["PREPARATION_SETTINGS", "REPO_ROOT", "SAMPLE_DATA_DIR", "RunSettings", "SourceSettings"]


def _s(section: str, title: str, description: str, default: Any,
       examples: list[Any] | None = None, **kw: Any) -> Any:
    # ``examples`` on a list makes the trigger form show a multi-select of those values.
    extra = {"section": section, **({"examples": examples} if examples else {})}
    return Field(default, title=title, description=description, json_schema_extra=extra, **kw)


class RunSettings(BaseModel):
    """Every setting of one run. Build it with ``from_mapping``; it is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              regex_engine="python-re")

    # --- Sources and preparation --------------------------------------------------------
    sources: list[SourceSettings] | None = _s(
        "Sources", "Sources",
        "The sources, in priority order (a prompt seen in two is kept in the first): names "
        "from the deployment's catalogue, optionally with quota/languages/exclude_sources/"
        "multi_turn, or new entries with a hub_id or a path under a data root. Empty: the "
        "whole catalogue.", None)
    dedupe_against: list[str] = _s(
        "Sources", "Dedupe against",
        "Existing prompt sets (local files under a data root, or s3:// locations read with the "
        "deployment's S3 connection); prompts already there are dropped.", [])
    shard_size: int = _s("Preparation", "Shard size",
                         "Prompts per shard (one mapped task each; its completions are held "
                         "in memory).", 1000, ge=1, le=20000)
    seed: int = _s("Preparation", "Seed", "Seed for quota sampling and shard order.", 0, ge=0)
    min_prompt_length: int = _s(
        "Preparation", "Minimum prompt length",
        "Shorter prompts are dropped (tokens with a tokenizer, characters otherwise).", 1, ge=0)
    max_prompt_length: int | None = _s(
        "Preparation", "Maximum prompt length",
        "Longer prompts are dropped (tokens with a tokenizer, characters otherwise); empty for "
        "no bound.", None, ge=1)
    # --- Model and servers --------------------------------------------------------------
    model_path: str = _s("Model and servers", "Model path",
                        "Model the servers load: one of the deployment's allowed models.",
                        "Qwen/Qwen3.6-27B")
    # No ':' (SGLang refuses it at start-up: it marks a LoRA adapter, "model:adapter").
    served_model_name: str | None = _s(
        "Model and servers", "Served model name", "Name the servers report; empty means the "
        "model path.", None, pattern=r"^(?!.*\n)[A-Za-z0-9._/\-]{1,200}$")
    tokenizer_path: str | None = _s(
        "Model and servers", "Tokenizer path",
        "The target model's tokenizer (hub id, or a local path under a data root) for token "
        "counts; empty means characters at preparation and the model path at generation.", None)
    context_length: int = _s("Model and servers", "Context length",
                            "Context length the servers must report (prompt + completion "
                            "tokens).", 32768, ge=256, le=1048576)
    tp_size: int = _s("Model and servers", "Tensor parallel size", "GPUs per server (--tp-size).",
                     1, ge=1, le=8)
    mem_fraction_static: float = _s(
        "Model and servers", "Memory fraction",
        "GPU memory share for weights and KV cache (--mem-fraction-static).", 0.85, ge=0.1,
        le=0.99)
    reasoning_parser: str | None = _s(
        "Model and servers", "Reasoning parser",
        "SGLang --reasoning-parser (qwen3 splits <think> into reasoning_content).", "qwen3",
        pattern=r"^(?!.*\n)[A-Za-z0-9_\-]{1,64}$")
    launch_timeout_s: float = _s("Model and servers", "Launch timeout (s)",
                                "Longest the health gate waits for a server to load its model.",
                                1800.0, ge=1.0, le=14400.0)
    replace_mismatched_servers: bool = _s(
        "Model and servers", "Replace mismatched servers",
        "Stop and relaunch a server already running with other settings.", False)
    # --- Sampling -----------------------------------------------------------------------
    temperature: float = _s("Sampling", "Temperature", "Sampling temperature.", 0.6, ge=0.0,
                           le=2.0)
    top_p: float = _s("Sampling", "Top-p", "Nucleus sampling mass.", 0.95, ge=0.0, le=1.0)
    top_k: int = _s("Sampling", "Top-k", "Top-k sampling; -1 disables it.", 20, ge=-1)
    max_tokens: int = _s(
        "Sampling", "Max tokens (cap)",
        "Upper bound on completion tokens; each request gets min(cap, context_length - prompt "
        "tokens - context_margin), so a cap at or above the context length is safe.", 8192, ge=1,
        le=1048576)
    min_completion_tokens: int = _s(
        "Sampling", "Minimum completion room",
        "A prompt that leaves fewer tokens than this for its completion is skipped, never sent.",
        256, ge=1, le=131072)
    context_margin: int = _s(
        "Sampling", "Context margin",
        "Tokens kept free below the context length (SGLang rejects prompt + max_tokens >= "
        "context length).", 16, ge=1, le=65536)
    enable_thinking: bool = _s("Sampling", "Thinking", "Ask reasoning models (Qwen3) to think.",
                              True)
    # --- Generation ---------------------------------------------------------------------
    concurrency_mode: Literal["adaptive", "fixed"] = _s(
        "Generation", "Concurrency mode",
        "'adaptive' sizes each server's in-flight window from its queue; 'fixed' keeps "
        "in_flight_per_server.", "adaptive")
    in_flight_per_server: int = _s("Generation", "In flight per server",
                                  "Requests in flight per server (fixed mode; the adaptive "
                                  "start).", 32, ge=1, le=4096)
    min_in_flight_per_server: int = _s("Generation", "Minimum in flight per server",
                                      "Adaptive lower bound.", 8, ge=1, le=4096)
    max_in_flight_per_server: int = _s("Generation", "Maximum in flight per server",
                                      "Adaptive upper bound.", 512, ge=1, le=4096)
    request_timeout_s: float = _s("Generation", "Request timeout (s)",
                                 "Longest a request may take before it is retried.", 1800.0,
                                 ge=1.0, le=21600.0)
    max_attempts: int = _s(
        "Generation", "Attempts per prompt",
        "Tries for retryable failures (connection, timeout, 5xx, queue full) before the prompt "
        "is recorded as failed; a failure counts only when its server was serving other "
        "prompts (a server-wide outage is waited out, not charged to the prompts).", 4, ge=1,
        le=20)
    cool_down_after_failures: int = _s(
        "Generation", "Cool down after failures",
        "Retryable failures in a row (5xx, timeout, queue full) after which a server gets no "
        "new requests for a cool-down; its in-flight requests run on. A server is taken out "
        "of rotation (its requests sent elsewhere) only when it is gone: connection refused "
        "or three failed health probes in a row.", 3, ge=1, le=100)
    cool_down_s: float = _s("Generation", "Cool-down (s)",
                            "First cool-down of a failing server; doubled for each cool-down "
                            "in a row, up to cool_down_max_s.", 5.0, ge=0.1, le=3600.0)
    cool_down_max_s: float = _s("Generation", "Longest cool-down (s)",
                                "Upper bound of a server's cool-down.", 30.0, ge=0.1,
                                le=3600.0)
    health_interval_s: float = _s("Generation", "Health check interval (s)",
                                 "How often every server's /health is polled during "
                                 "generation.", 5.0, ge=0.1, le=300.0)
    progress_interval_s: float = _s("Generation", "Progress interval (s)",
                                   "How often generation logs progress.", 30.0, ge=0.1,
                                   le=3600.0)
    # --- Shards -------------------------------------------------------------------------
    shard_range: str | None = _s(
        "Shards", "Shard range",
        "Only these shards, e.g. '120-179' or '0-9,42'; empty for all. Prompt shards of an "
        "earlier run with the same preparation settings are reused.", None,
        pattern=SHARD_RANGE_PATTERN)
    force_regenerate: bool = _s(
        "Shards", "Force regeneration",
        "Generate the selected shards again into a new location (regenerations/<run id>/ "
        "under the run), never over earlier outputs.", False)
    # --- Output -------------------------------------------------------------------------
    run_name: str = _s("Output", "Run name",
                      "Folder for this run under the deployment's output root (e.g. "
                      "expansion_v1).", "local", pattern=NAME_PATTERN)
    # --- Tokenization -------------------------------------------------------------------
    max_sequence_length: int = _s("Tokenization", "Max sequence length",
                                 "Longest tokenized sample (prompt + completion tokens).",
                                 32768, ge=16, le=1048576)
    over_length: Literal["drop", "truncate"] = _s(
        "Tokenization", "Over-length samples",
        "'drop' or 'truncate' samples longer than max_sequence_length.", "drop")
    keep_truncated_completions: bool = _s(
        "Tokenization", "Keep truncated completions",
        "Train on completions cut by max_tokens (finish_reason 'length').", False)
    include_reasoning: bool = _s("Tokenization", "Include reasoning",
                                "Render the reasoning (<think>...</think>) into the training "
                                "text.", True)
    quality_filters_off: list[QualityFilter] = _s(
        "Tokenization", "Quality filters off",
        "Output quality filters not to run; each one keeps completions out of the samples, "
        "quarantined and counted with its name as the reason: degenerate_repetition (a "
        "loop), unclosed_think (a finished turn still thinking), empty_answer (nothing after "
        "thinking), invalid_tool_call_json (a Hermes tool_call block whose body is not a "
        "JSON object with name and arguments), near_duplicate (one answer given to different "
        "prompts, within a shard). Empty: all run.", [], examples=list(QualityFilter.__args__))
    # --- Quality gates ------------------------------------------------------------------
    max_truncation_rate: float = _s(
        "Quality gates", "Max truncation rate",
        "Fail the run (no dataset asset event) when more than this share of completions were "
        "cut by max_tokens (finish_reason 'length').", 0.2, ge=0.0, le=1.0)
    max_failure_rate: float = _s(
        "Quality gates", "Max failure rate",
        "Fail the run when more than this share of the prompts sent to the servers ended "
        "failed (skipped prompts are never sent).", 0.01, ge=0.0, le=1.0)
    min_completions_per_source: int = _s(
        "Quality gates", "Min completions per source",
        "Fail the run when a source that kept prompts at preparation has fewer completions "
        "than this.", 0, ge=0)
    max_quarantine_rate: float = _s(
        "Quality gates", "Max quarantine rate",
        "Fail the run when more than this share of completions were quarantined by the "
        "tokenization checks or the output quality filters.", 0.01, ge=0.0, le=1.0)

    _deployment: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> RunSettings:
        if self.cool_down_s > self.cool_down_max_s:
            raise ValueError(f"setting `cool_down_s`: {self.cool_down_s} is above "
                             f"`cool_down_max_s` ({self.cool_down_max_s})")
        if self.min_in_flight_per_server > self.max_in_flight_per_server:
            raise ValueError(
                f"setting `min_in_flight_per_server`: {self.min_in_flight_per_server} is above "
                f"`max_in_flight_per_server` ({self.max_in_flight_per_server})")
        room = self.context_length - self.context_margin - self.min_completion_tokens
        if room < 1:
            raise ValueError(
                f"setting `context_length`: {self.context_length} leaves no room for a prompt "
                f"after context_margin ({self.context_margin}) and min_completion_tokens "
                f"({self.min_completion_tokens}); raise context_length or lower those")
        if self.max_prompt_length is not None and self.max_prompt_length < self.min_prompt_length:
            raise ValueError(
                f"setting `max_prompt_length`: {self.max_prompt_length} is below "
                f"`min_prompt_length` ({self.min_prompt_length})")
        if self.shard_range:
            for part in self.shard_range.replace(" ", "").split(","):
                lo, _, hi = part.partition("-")
                if hi and int(lo) > int(hi):
                    raise ValueError(
                        f"setting `shard_range`: {part!r} in {self.shard_range!r} runs "
                        f"backwards; accepted: low-high, e.g. '{hi}-{lo}'")
        if self.sources is not None:
            names = [s.name for s in self.sources]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"setting `sources`: names must be unique; repeated: {dupes}")
        return self

    # --- binding to the deployment -------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Any = None, deployment: Any = None) -> RunSettings:
        """Build run settings from a trigger conf or params; raise SettingsError if wrong.

        ``None`` values mean "use the default" (an empty form field). The settings are bound
        to ``deployment`` (read from the environment when not given): catalogue sources are
        resolved, and the model, local paths and names are checked against it.
        """
        from include.settings.resolve import resolve_run

        return resolve_run(cls, values, deployment)

    @property
    def deployment(self) -> Any:
        """Return the deployment settings this run is bound to."""
        if self._deployment is None:
            raise RuntimeError("RunSettings not bound to a deployment; use from_mapping")
        return self._deployment

    @property
    def run_uri(self) -> str:
        """Return the location all of this run's outputs live under."""
        return self.deployment.output_root.rstrip("/") + "/" + self.run_name

    @property
    def api_key(self) -> str | None:
        """Return the servers' API key (from the deployment's connection), or None."""
        return self.deployment.api_key

    # --- derived values -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return the settings as JSON-ready data (the inverse of ``from_mapping``)."""
        return self.model_dump(mode="json")

    def subset(self, names: tuple[str, ...]) -> dict[str, Any]:
        """Return the named settings as JSON-ready data."""
        return self.model_dump(mode="json", include=set(names))

    def fingerprint(self, names: tuple[str, ...]) -> str:
        """Return a short stable hash of the named settings (e.g. those that shape prompts)."""
        blob = json.dumps(self.subset(names), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def preparation_differences(self, manifest: dict[str, Any]) -> list[str]:
        """Return the preparation settings that differ from those a prompt manifest records."""
        ours = self.subset(PREPARATION_SETTINGS)
        theirs = manifest.get("preparation_settings", {})
        return [n for n in PREPARATION_SETTINGS if ours.get(n) != theirs.get(n)]

    @property
    def model_name(self) -> str:
        """Return the name the servers must report (served name, else the model path)."""
        return self.served_model_name or self.model_path

    def shard_numbers(self, total: int) -> list[int]:
        """Return the shard indices ``shard_range`` selects out of ``total`` (all if unset)."""
        from include.settings.errors import SettingsError

        if not self.shard_range:
            return list(range(total))
        chosen: set[int] = set()
        for part in self.shard_range.replace(" ", "").split(","):
            first, _, last = part.partition("-")
            lo, hi = int(first), int(last or first)
            if hi >= total:
                raise SettingsError(
                    f"setting `shard_range`: {part!r} is outside the {total} shards of this run; "
                    f"accepted: shard numbers 0-{total - 1}")
            chosen.update(range(lo, hi + 1))
        return sorted(chosen)


#: Settings that decide which prompts exist and how they are sharded; equal fingerprints mean
#: an earlier run's prompt shards can be reused.
PREPARATION_SETTINGS = (
    "sources",
    "dedupe_against",
    "shard_size",
    "seed",
    "min_prompt_length",
    "max_prompt_length",
    "tokenizer_path",
)
