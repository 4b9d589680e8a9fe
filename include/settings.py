"""One typed run configuration: every setting of a run, its default, and its checks.

Every setting has exactly one name, used unchanged in the DAG's trigger form (``Param`` keys),
in ``airflow dags trigger -c`` JSON, in code (``RunSettings`` attributes), in logs and in the
docs. ``RunSettings.from_mapping`` is the only way in: it rejects a wrong setting before any
work, with a message naming the setting, the value it got and the values it accepts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA_DIR = REPO_ROOT / "include" / "sample_data"

#: Airflow refuses to expand a mapped task over more than this many items (core.max_map_length).
AIRFLOW_MAX_MAP_LENGTH = 1024

SOURCE_KINDS = (
    "auto",
    "infinity_instruct",
    "webinstructsub",
    "codefeedback",
    "metamathqa",
    "hermes_function_calling",
    "agentinstruct",
    "orca_agentinstruct",
    "agent_flan",
)
MULTI_TURN_POLICIES = ("first_user", "until_first_trained_assistant", "until_last_user")
CONCURRENCY_MODES = ("adaptive", "fixed")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class SettingsError(ValueError):
    """A setting is wrong; the message names it, the value it got and what it accepts."""


def _setting(
    default: Any,
    *,
    title: str,
    description: str,
    section: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    pattern: str | None = None,
    accepted: str | None = None,
) -> Any:
    meta = {
        "title": title,
        "description": description,
        "section": section,
        "minimum": minimum,
        "maximum": maximum,
        "choices": choices,
        "pattern": pattern,
        "accepted": accepted or "lowercase letters, digits, '_' and '-'",
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SourceSettings:
    """Where one source dataset lives and how its rows become prompts."""

    name: str = _setting(
        "",
        title="Name",
        description="Short unique name, used in prompt ids.",
        section="Sources",
        pattern=_NAME_RE.pattern,
    )
    kind: str = _setting(
        "auto",
        title="Kind",
        description="Dataset layout; 'auto' recognises it from the columns.",
        section="Sources",
        choices=SOURCE_KINDS,
    )
    path: str | None = _setting(
        None,
        title="Local path",
        description="A file, directory or glob of parquet/JSON/JSONL files.",
        section="Sources",
    )
    hub_id: str | None = _setting(
        None,
        title="Hub id",
        description="Hugging Face dataset id, read when no path is given.",
        section="Sources",
    )
    config: str | None = _setting(
        None,
        title="Config",
        description="Dataset config (hub) and the config part of prompt ids.",
        section="Sources",
    )
    revision: str | None = _setting(
        None,
        title="Revision",
        description="Hub revision (commit or tag) to pin.",
        section="Sources",
    )
    split: str = _setting("train", title="Split", description="Dataset split.", section="Sources")
    quota: int | None = _setting(
        None,
        title="Quota",
        description="Most prompts kept from this source (seeded sample).",
        section="Sources",
        minimum=0,
    )
    languages: list[str] | None = _setting(
        None,
        title="Languages",
        description="Keep only rows in these languages (sources with a language column).",
        section="Sources",
    )
    exclude_sources: list[str] = _setting(
        [],
        title="Excluded source values",
        description="Drop rows whose source column has one of "
        "these values (e.g. WebInstructSub 'socratic', which is CC BY-NC).",
        section="Sources",
    )
    multi_turn: str = _setting(
        "first_user",
        title="Multi-turn policy",
        description="Which turns make the prompt: "
        "'first_user' (system + first user turn), 'until_first_trained_assistant' (every turn "
        "before the first assistant turn with loss=true), 'until_last_user' (every turn up to the "
        "last user turn).",
        section="Sources",
        choices=MULTI_TURN_POLICIES,
    )


@dataclass(frozen=True)
class GpuHostSettings:
    """One GPU host: how to reach it and which GPUs get a server."""

    host: str = _setting(
        "127.0.0.1",
        title="Host",
        description="Address the servers are reached at (and a name for logs).",
        section="Model and servers",
    )
    ssh_conn_id: str | None = _setting(
        None,
        title="SSH connection",
        description="Airflow SSH connection to the host; empty runs commands on this machine.",
        section="Model and servers",
    )
    gpus: list[int] = _setting(
        [0, 1, 2, 3, 4, 5, 6, 7],
        title="GPUs",
        description="GPU indices; one server each, on port port_base + index.",
        section="Model and servers",
    )
    command_prefix: str | None = _setting(
        None,
        title="Command prefix",
        description="Prefix for every command on the host, for servers in a container "
        "(e.g. 'pct exec 200 --' or 'docker exec NAME').",
        section="Model and servers",
    )


@dataclass(frozen=True)
class RunSettings:
    """Every setting of one run. Build it with ``from_mapping``; it is immutable."""

    # --- Sources and preparation ---------------------------------------------------------
    sources: list[SourceSettings] = _setting(
        [],
        title="Sources",
        description="The source datasets, in priority order: a prompt seen "
        "in two sources is kept in the first.",
        section="Sources",
    )
    dedupe_against: list[str] = _setting(
        [],
        title="Dedupe against",
        description="Existing prompt sets (local files/dirs or s3:// "
        "prefixes); prompts already there are dropped.",
        section="Sources",
    )
    shard_size: int = _setting(
        1000,
        title="Shard size",
        description="Prompts per shard (one mapped task each).",
        section="Preparation",
        minimum=1,
    )
    seed: int = _setting(
        0,
        title="Seed",
        description="Seed for quota sampling and shard order.",
        section="Preparation",
        minimum=0,
    )
    min_prompt_length: int = _setting(
        1,
        title="Minimum prompt length",
        description="Shorter prompts are dropped (tokens with a tokenizer, characters otherwise).",
        section="Preparation",
        minimum=0,
    )
    max_prompt_length: int | None = _setting(
        None,
        title="Maximum prompt length",
        description="Longer prompts are dropped (tokens with "
        "a tokenizer, characters otherwise); empty for no bound.",
        section="Preparation",
        minimum=1,
    )
    # --- Model and servers ---------------------------------------------------------------
    model_path: str = _setting(
        "Qwen/Qwen3.6-27B",
        title="Model path",
        description="Model the servers load (hub id or path on the GPU host).",
        section="Model and servers",
    )
    served_model_name: str | None = _setting(
        None,
        title="Served model name",
        description="Name the servers report; empty means the model path.",
        section="Model and servers",
    )
    tokenizer_path: str | None = _setting(
        None,
        title="Tokenizer path",
        description="The target model's tokenizer (local path or "
        "hub id) for token counts; empty means characters at preparation and the model path "
        "at generation.",
        section="Model and servers",
    )
    context_length: int = _setting(
        32768,
        title="Context length",
        description="Context length the servers must report (prompt + completion tokens).",
        section="Model and servers",
        minimum=256,
    )
    api_key: str | None = _setting(
        None,
        title="API key",
        description="Bearer key the servers expect, if any.",
        section="Model and servers",
    )
    gpu_hosts: list[GpuHostSettings] = _setting(
        [{"host": "127.0.0.1", "ssh_conn_id": None, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}],
        title="GPU hosts",
        description="Hosts to run servers on, each with its GPUs; a server already running "
        "there with the run's model and context length is reused.",
        section="Model and servers",
    )
    port_base: int = _setting(
        30000,
        title="Port base",
        description="GPU i serves on port port_base + i.",
        section="Model and servers",
        minimum=1024,
        maximum=65000,
    )
    tp_size: int = _setting(
        1,
        title="Tensor parallel size",
        description="GPUs per server (--tp-size).",
        section="Model and servers",
        minimum=1,
    )
    mem_fraction_static: float = _setting(
        0.85,
        title="Memory fraction",
        description="GPU memory share for weights and KV cache (--mem-fraction-static).",
        section="Model and servers",
        minimum=0.1,
        maximum=0.99,
    )
    reasoning_parser: str | None = _setting(
        "qwen3",
        title="Reasoning parser",
        description="SGLang --reasoning-parser (qwen3 splits <think> into reasoning_content).",
        section="Model and servers",
    )
    server_launch_command: str = _setting(
        "python3 -m sglang.launch_server",
        title="Server launch command",
        description="Command that starts one server; flags are appended.",
        section="Model and servers",
    )
    extra_server_args: list[str] = _setting(
        ["--enable-metrics"],
        title="Extra server arguments",
        description="More flags for every server; --enable-metrics feeds adaptive concurrency.",
        section="Model and servers",
    )
    server_log_dir: str = _setting(
        "/tmp/sglang-regen",
        title="Server log directory",
        description="Directory on the GPU host for server logs and pid files.",
        section="Model and servers",
    )
    launch_timeout_s: float = _setting(
        1800.0,
        title="Launch timeout (s)",
        description="Longest the health gate waits for a server to load its model.",
        section="Model and servers",
        minimum=1.0,
    )
    replace_mismatched_servers: bool = _setting(
        False,
        title="Replace mismatched servers",
        description="Stop and relaunch a server already running with other settings.",
        section="Model and servers",
    )
    # --- Sampling ------------------------------------------------------------------------
    temperature: float = _setting(
        0.6,
        title="Temperature",
        description="Sampling temperature.",
        section="Sampling",
        minimum=0.0,
        maximum=2.0,
    )
    top_p: float = _setting(
        0.95,
        title="Top-p",
        description="Nucleus sampling mass.",
        section="Sampling",
        minimum=0.0,
        maximum=1.0,
    )
    top_k: int = _setting(
        20,
        title="Top-k",
        description="Top-k sampling; -1 disables it.",
        section="Sampling",
        minimum=-1,
    )
    max_tokens: int = _setting(
        8192,
        title="Max tokens (cap)",
        description="Upper bound on completion tokens; each "
        "request gets min(cap, context_length - prompt tokens - context_margin).",
        section="Sampling",
        minimum=1,
    )
    min_completion_tokens: int = _setting(
        256,
        title="Minimum completion room",
        description="A prompt that leaves fewer tokens "
        "than this for its completion is skipped, never sent.",
        section="Sampling",
        minimum=1,
    )
    context_margin: int = _setting(
        16,
        title="Context margin",
        description="Tokens kept free below the context length "
        "(SGLang rejects prompt + max_tokens >= context length).",
        section="Sampling",
        minimum=1,
    )
    enable_thinking: bool = _setting(
        True,
        title="Thinking",
        description="Ask reasoning models (Qwen3) to think.",
        section="Sampling",
    )
    # --- Generation ----------------------------------------------------------------------
    concurrency_mode: str = _setting(
        "adaptive",
        title="Concurrency mode",
        description="'adaptive' sizes each server's "
        "in-flight window from its queue; 'fixed' keeps in_flight_per_server.",
        section="Generation",
        choices=CONCURRENCY_MODES,
    )
    in_flight_per_server: int = _setting(
        32,
        title="In flight per server",
        description="Requests in flight per server (fixed mode; the adaptive start).",
        section="Generation",
        minimum=1,
    )
    min_in_flight_per_server: int = _setting(
        8,
        title="Minimum in flight per server",
        description="Adaptive lower bound.",
        section="Generation",
        minimum=1,
    )
    max_in_flight_per_server: int = _setting(
        512,
        title="Maximum in flight per server",
        description="Adaptive upper bound.",
        section="Generation",
        minimum=1,
    )
    request_timeout_s: float = _setting(
        1800.0,
        title="Request timeout (s)",
        description="Longest a request may take before it is retried.",
        section="Generation",
        minimum=1.0,
    )
    max_attempts: int = _setting(
        4,
        title="Attempts per prompt",
        description="Tries for retryable failures (connection, "
        "timeout, 5xx, queue full) before the prompt is recorded as failed.",
        section="Generation",
        minimum=1,
    )
    eject_after_failures: int = _setting(
        3,
        title="Eject after failures",
        description="Consecutive failures that take a server "
        "out of rotation until /health is 200 again.",
        section="Generation",
        minimum=1,
    )
    health_interval_s: float = _setting(
        5.0,
        title="Health check interval (s)",
        description="How often every server's /health is polled during generation.",
        section="Generation",
        minimum=0.1,
    )
    progress_interval_s: float = _setting(
        30.0,
        title="Progress interval (s)",
        description="How often generation logs progress.",
        section="Generation",
        minimum=0.1,
    )
    # --- Shards -------------------------------------------------------------------------
    shard_range: str | None = _setting(
        None,
        title="Shard range",
        description="Only these shards, e.g. '120-179' or '0-9,42'; empty for all. Prompt "
        "shards of an earlier run with the same preparation settings are reused.",
        section="Shards",
        pattern=r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$",
        accepted="shard numbers and ranges, e.g. '120-179' or '0-9,42'",
    )
    force_regenerate: bool = _setting(
        False,
        title="Force regeneration",
        description="Generate the selected shards again into a new location "
        "(regenerations/<run id>/ under the run), never over earlier outputs.",
        section="Shards",
    )
    # --- Output --------------------------------------------------------------------------
    output_uri: str = _setting(
        str(REPO_ROOT / "var" / "runs"),
        title="Output location",
        description="Local directory or s3://bucket/prefix under which this run writes.",
        section="Output",
    )
    run_name: str = _setting(
        "local",
        title="Run name",
        description="Folder for this run under the output location (e.g. expansion_v1).",
        section="Output",
        pattern=_NAME_RE.pattern,
    )
    s3_conn_id: str = _setting(
        "aws_default",
        title="S3 connection",
        description="Airflow AWS connection for s3:// locations (endpoint URL in its extra).",
        section="Output",
    )
    protected_prefixes: list[str] = _setting(
        ["completions/"],
        title="Protected prefixes",
        description="Locations no run may write in, contain or be inside (the original data).",
        section="Output",
    )
    # --- Tokenization --------------------------------------------------------------------
    max_sequence_length: int = _setting(
        32768,
        title="Max sequence length",
        description="Longest tokenized sample (prompt + completion tokens).",
        section="Tokenization",
        minimum=16,
    )
    over_length: str = _setting(
        "drop",
        title="Over-length samples",
        description="'drop' or 'truncate' samples longer than max_sequence_length.",
        section="Tokenization",
        choices=("drop", "truncate"),
    )
    keep_truncated_completions: bool = _setting(
        False,
        title="Keep truncated completions",
        description="Train on completions cut by max_tokens (finish_reason 'length').",
        section="Tokenization",
    )
    include_reasoning: bool = _setting(
        True,
        title="Include reasoning",
        description="Render the reasoning (<think>...</think>) into the training text.",
        section="Tokenization",
    )

    # --- Quality gates ------------------------------------------------------------------
    max_truncation_rate: float = _setting(
        0.2,
        title="Max truncation rate",
        description="Fail the run (no dataset asset event) when more than this share of "
        "completions were cut by max_tokens (finish_reason 'length').",
        section="Quality gates",
        minimum=0.0,
        maximum=1.0,
    )
    max_failure_rate: float = _setting(
        0.01,
        title="Max failure rate",
        description="Fail the run when more than this share of the prompts sent to the "
        "servers ended failed (skipped prompts are never sent).",
        section="Quality gates",
        minimum=0.0,
        maximum=1.0,
    )
    min_completions_per_source: int = _setting(
        0,
        title="Min completions per source",
        description="Fail the run when a source that kept prompts at preparation has fewer "
        "completions than this.",
        section="Quality gates",
        minimum=0,
    )
    max_quarantine_rate: float = _setting(
        0.01,
        title="Max quarantine rate",
        description="Fail the run when more than this share of completions were quarantined "
        "by the tokenization checks.",
        section="Quality gates",
        minimum=0.0,
        maximum=1.0,
    )

    # ------------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None = None) -> RunSettings:
        """Build settings from defaults overridden by ``values``; raise SettingsError if wrong.

        ``None`` values mean "use the default" so that an empty trigger-form field works.
        """
        values = dict(values or {})
        if values.get("sources") is None:
            values["sources"] = default_sources()
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingsError(f"unknown setting(s) {unknown}; accepted settings: {sorted(known)}")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in values and values[f.name] is not None:
                kwargs[f.name] = _coerce(f.name, values[f.name], f)
            elif f.default_factory is not dataclasses.MISSING:
                # Defaults of nested settings are plain data; coerce them like given values.
                kwargs[f.name] = _coerce(f.name, f.default_factory(), f)
        settings = cls(**kwargs)
        settings._check()
        return settings

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as JSON-ready data (the inverse of ``from_mapping``)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def subset(self, names: tuple[str, ...]) -> dict[str, Any]:
        """Return the named settings as JSON-ready data."""
        data = self.to_dict()
        return {n: data[n] for n in names}

    def fingerprint(self, names: tuple[str, ...]) -> str:
        """Return a short stable hash of the named settings (e.g. those that shape prompts)."""
        data = self.subset(names)
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def model_name(self) -> str:
        """Return the name the servers must report (served name, else the model path)."""
        return self.served_model_name or self.model_path

    def shard_numbers(self, total: int) -> list[int]:
        """Return the shard indices ``shard_range`` selects out of ``total`` (all if unset)."""
        if not self.shard_range:
            return list(range(total))
        chosen: set[int] = set()
        for part in self.shard_range.replace(" ", "").split(","):
            first, _, last = part.partition("-")
            lo, hi = int(first), int(last or first)
            if lo > hi or hi >= total:
                raise SettingsError(
                    f"setting `shard_range`: {part!r} is outside the {total} shards of this run "
                    f"(0-{total - 1})" if hi >= total else
                    f"setting `shard_range`: {part!r} runs backwards; write it low-high"
                )
            chosen.update(range(lo, hi + 1))
        return sorted(chosen)

    @property
    def run_uri(self) -> str:
        """Return the location all of this run's outputs live under."""
        return self.output_uri.rstrip("/") + "/" + self.run_name

    def _check(self) -> None:
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SettingsError(f"setting `sources`: names must be unique; repeated: {dupes}")
        for s in self.sources:
            if not s.name:
                raise SettingsError("setting `sources`: every source needs a `name`")
            if not (s.path or s.hub_id):
                raise SettingsError(
                    f"setting `sources` ({s.name}): give `path` (local files) or `hub_id`"
                )
        if self.min_in_flight_per_server > self.max_in_flight_per_server:
            raise SettingsError(
                f"setting `min_in_flight_per_server`: {self.min_in_flight_per_server} is above "
                f"`max_in_flight_per_server` ({self.max_in_flight_per_server})"
            )
        room = self.context_length - self.context_margin - self.min_completion_tokens
        if room < 1:
            raise SettingsError(
                f"setting `context_length`: {self.context_length} leaves no room for a prompt "
                f"after context_margin ({self.context_margin}) and min_completion_tokens "
                f"({self.min_completion_tokens}); raise context_length or lower those"
            )
        if self.max_prompt_length is not None and self.max_prompt_length < self.min_prompt_length:
            raise SettingsError(
                f"setting `max_prompt_length`: {self.max_prompt_length} is below "
                f"`min_prompt_length` ({self.min_prompt_length})"
            )


def log_settings(values: Mapping[str, Any] | None) -> RunSettings:
    """Validate settings and log them resolved (secrets masked); return them."""
    import logging

    settings = RunSettings.from_mapping(values)
    data = settings.to_dict()
    if data.get("api_key"):
        data["api_key"] = "***"
    logging.getLogger(__name__).info(
        "resolved settings (run location %s):\n%s", settings.run_uri,
        "\n".join(f"  {k} = {json.dumps(v)}" for k, v in data.items()),
    )
    return settings


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


def _describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _describe_type(inner[0]) + " or null"
    if origin is list:
        return "a list of " + _describe_type(typing.get_args(tp)[0])
    if dataclasses.is_dataclass(tp):
        return "an object with keys " + str([f.name for f in dataclasses.fields(tp)])
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(
        tp, str(tp)
    )


def _coerce(name: str, value: Any, f: dataclasses.Field, owner: type = RunSettings) -> Any:
    hints = typing.get_type_hints(owner)
    tp = hints[f.name]
    try:
        out = _coerce_type(name, value, tp)
    except SettingsError:
        raise
    except (TypeError, ValueError):
        raise SettingsError(
            f"setting `{name}`: got {value!r}; accepted: {_describe_type(tp)}"
        ) from None
    meta = f.metadata
    if out is not None and not isinstance(out, list | bool):
        if meta.get("choices") and out not in meta["choices"]:
            raise SettingsError(
                f"setting `{name}`: got {out!r}; accepted values: {list(meta['choices'])}"
            )
        if meta.get("minimum") is not None and out < meta["minimum"]:
            raise SettingsError(f"setting `{name}`: got {out!r}; accepted: >= {meta['minimum']}")
        if meta.get("maximum") is not None and out > meta["maximum"]:
            raise SettingsError(f"setting `{name}`: got {out!r}; accepted: <= {meta['maximum']}")
        if meta.get("pattern") and not re.match(meta["pattern"], str(out)):
            raise SettingsError(
                f"setting `{name}`: got {out!r}; accepted: {meta['accepted']}"
            )
    return out


def _coerce_type(name: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce_type(name, value, inner)
    if origin is list:
        if isinstance(value, str):
            value = (
                json.loads(value)
                if value.strip().startswith("[")
                else [v.strip() for v in value.split(",") if v.strip()]
            )
        if not isinstance(value, list):
            raise TypeError(name)
        (inner,) = typing.get_args(tp)
        return [_coerce_type(f"{name}[{i}]", v, inner) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(name)
        known = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise SettingsError(
                f"setting `{name}`: unknown key(s) {unknown}; accepted keys: {sorted(known)}"
            )
        kwargs = {
            k: _coerce(f"{name}.{k}", v, known[k], owner=tp)
            for k, v in value.items()
            if v is not None
        }
        return tp(**kwargs)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(name)
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise TypeError(name)
        return int(value)
    if tp is float:
        if isinstance(value, bool):
            raise TypeError(name)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(name)
        return value
    raise TypeError(name)


def default_sources() -> list[dict[str, Any]]:
    """Return the bundled sample sources (real schemas, small files) as settings data."""
    d = SAMPLE_DATA_DIR
    return [
        {
            "name": "infinity_instruct",
            "kind": "infinity_instruct",
            "config": "0625",
            "path": str(d / "infinity_instruct_0625.parquet"),
        },
        {
            "name": "webinstructsub",
            "kind": "webinstructsub",
            "path": str(d / "webinstructsub.parquet"),
            "exclude_sources": ["socratic"],
        },
        {"name": "codefeedback", "kind": "codefeedback", "path": str(d / "codefeedback.jsonl")},
        {"name": "metamathqa", "kind": "metamathqa", "path": str(d / "MetaMathQA-395K.json")},
        {
            "name": "hermes_fc",
            "kind": "hermes_function_calling",
            "config": "func_calling",
            "path": str(d / "hermes_func_calling.json"),
        },
        {
            "name": "hermes_fc_singleturn",
            "kind": "hermes_function_calling",
            "config": "func_calling_singleturn",
            "path": str(d / "hermes_func_calling_singleturn.json"),
        },
        {
            "name": "hermes_glaive",
            "kind": "hermes_function_calling",
            "config": "glaive_function_calling_5k",
            "path": str(d / "hermes_glaive_function_calling_5k.json"),
        },
        {
            "name": "agentinstruct",
            "kind": "agentinstruct",
            "config": "os",
            "path": str(d / "agentinstruct_os.parquet"),
            "multi_turn": "until_first_trained_assistant",
        },
    ]


def _json_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        schema = _json_schema(inner)
        schema["type"] = [schema["type"], "null"]
        return schema
    if origin is list:
        return {"type": "array", "items": _json_schema(typing.get_args(tp)[0])}
    if dataclasses.is_dataclass(tp):
        return {"type": "object"}
    return {"type": {int: "integer", float: "number", bool: "boolean", str: "string"}[tp]}


def airflow_params() -> dict[str, Any]:
    """Return the DAG's trigger form: one typed ``Param`` per setting, defaults from here.

    Titles, descriptions, sections and bounds come from the settings' own metadata, so the
    form, ``from_mapping`` and the docs cannot disagree.
    """
    from airflow.sdk import Param

    defaults = RunSettings.from_mapping({}).to_dict()
    hints = typing.get_type_hints(RunSettings)
    params: dict[str, Any] = {}
    for f in dataclasses.fields(RunSettings):
        meta = f.metadata
        schema = _json_schema(hints[f.name])
        for key, value in (("minimum", meta["minimum"]), ("maximum", meta["maximum"])):
            if value is not None:
                schema[key] = value
        if meta["choices"]:
            schema["enum"] = list(meta["choices"])
        if meta["pattern"]:
            schema["pattern"] = meta["pattern"]
        params[f.name] = Param(
            defaults[f.name],
            title=meta["title"],
            description=meta["description"],
            section=meta["section"],
            **schema,
        )
    return params
