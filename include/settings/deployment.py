"""Deployment settings: what runs where. Owned by whoever deploys, never by a trigger.

GPU hosts and their SSH connections, the launch command and container prefix, ports, the
servers' log directory, the models a run may choose, the output root and its S3 connection,
protected prefixes, the data roots local sources may come from, the source catalogue and the
servers' API key connection. They come from environment variables named ``REGEN_<SETTING>``
(upper case; lists and objects as JSON) in the environment of every Airflow component that
runs tasks, read when a task runs; only ``PARSE_TIME_SETTINGS`` (task arguments, and the
form's default model) are read when the DAG file is parsed, by
``DeploymentSettings.parse_time_values`` (environment only).
``.env.example`` and docs/settings.md ("Deployment settings") list them;
``docker-compose.yaml`` sets them once for every service.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from include.settings.errors import describe, raise_all
from include.settings.fields import REPO_ROOT, SAMPLE_DATA_DIR, SourceSettings

log = logging.getLogger(__name__)

ENV_PREFIX = "REGEN_"
#: The deployment settings read when the DAG file is parsed: two task arguments, and the models
#: a run may choose (the trigger form's default model is the first of them).
PARSE_TIME_SETTINGS = ("max_active_shards", "defer_health_gate", "allowed_models")


class ParseTimeValues(NamedTuple):
    """The ``PARSE_TIME_SETTINGS``, validated as ``DeploymentSettings`` validates them."""

    max_active_shards: int
    defer_health_gate: bool
    allowed_models: list[str]


def env_name(setting: str) -> str:
    """Return the environment variable that configures deployment ``setting``."""
    return ENV_PREFIX + setting.upper()


class GpuHost(BaseModel):
    """One GPU host: how to reach it and which GPUs get a server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Address the servers are reached at.")
    ssh_conn_id: str | None = Field(
        None, description="Airflow SSH connection to the host; null runs commands on the worker."
    )
    gpus: list[int] = Field(
        [0, 1, 2, 3, 4, 5, 6, 7], description="GPU indices; one server each, on port_base + i."
    )
    command_prefix: str | None = Field(
        None,
        description="Prefix for every command on the host, for servers in a container "
        "(e.g. 'pct exec 200 --').",
    )

    @property
    def is_loopback(self) -> bool:
        """Return whether the servers on this host are only reachable from this machine."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def bundled_catalogue() -> dict[str, SourceSettings]:
    """Return the bundled sample sources (the real schemas, small files), by name."""
    d = SAMPLE_DATA_DIR
    entries: list[dict[str, Any]] = [
        {"name": "infinity_instruct", "kind": "infinity_instruct", "config": "0625",
         "path": str(d / "infinity_instruct_0625.parquet")},
        {"name": "webinstructsub", "kind": "webinstructsub",
         "path": str(d / "webinstructsub.parquet"), "exclude_sources": ["socratic"]},
        {"name": "codefeedback", "kind": "codefeedback", "path": str(d / "codefeedback.jsonl")},
        {"name": "metamathqa", "kind": "metamathqa", "path": str(d / "MetaMathQA-395K.json")},
        {"name": "hermes_fc", "kind": "hermes_function_calling", "config": "func_calling",
         "path": str(d / "hermes_func_calling.json")},
        {"name": "hermes_fc_singleturn", "kind": "hermes_function_calling",
         "config": "func_calling_singleturn",
         "path": str(d / "hermes_func_calling_singleturn.json")},
        {"name": "hermes_glaive", "kind": "hermes_function_calling",
         "config": "glaive_function_calling_5k",
         "path": str(d / "hermes_glaive_function_calling_5k.json")},
        {"name": "agentinstruct", "kind": "agentinstruct", "config": "os",
         "path": str(d / "agentinstruct_os.parquet"),
         "multi_turn": "until_first_trained_assistant"},
    ]
    return {e["name"]: SourceSettings(**e) for e in entries}


class DeploymentSettings(BaseSettings):
    """Every deployment setting, from ``REGEN_*`` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, case_sensitive=False
    )

    gpu_hosts: list[GpuHost] = Field(
        [GpuHost()], description="Hosts the servers run on, each with its GPUs and SSH connection."
    )
    server_launch_command: str = Field(
        "python3 -m sglang.launch_server",
        description="Command that starts one server on a GPU host; flags are appended.",
    )
    extra_server_args: list[str] = Field(
        ["--enable-metrics"], description="More flags for every server."
    )
    port_base: int = Field(30000, ge=1024, le=65000, description="GPU i serves on port_base + i.")
    server_log_dir: str = Field(
        "/tmp/sglang-regen", description="Directory on the GPU host for server logs, pid files "
        "and leases."
    )
    sglang_conn_id: str = Field(
        "sglang_default",
        description="Airflow connection whose password is the servers' API key (no key if the "
        "connection does not exist; required for any non-loopback host).",
    )
    allowed_models: list[str] = Field(
        ["Qwen/Qwen3.6-27B"], min_length=1,
        description="Models a run may choose as model_path (hub ids or paths on the GPU host); "
        "the first is the default. Read when the DAG file is parsed (the form's default).",
    )
    allowed_drafters: dict[str, str] = Field(
        {}, description="Drafters an evaluation (the evaluate_drafter DAG) may load: name -> "
        "checkpoint directory, the same path on the GPU hosts and the workers (its config.json "
        "is read from it). A trigger names a drafter; only this resolves it to a path.",
    )
    allowed_prompt_sets: dict[str, str] = Field(
        {}, description="Prompt sets an evaluation may measure beside the held-out split: "
        "name -> a file inside a data root (MT-Bench's question.jsonl, GSM8K's test.jsonl, "
        "HumanEval's HumanEval.jsonl.gz, or a parquet of the same columns; docs/evaluation.md). "
        "A trigger names a set; only this resolves it to a file.",
    )
    output_root: str = Field(
        str(REPO_ROOT / "var" / "runs"),
        description="Local directory or s3://bucket/prefix every run writes under "
        "(<output_root>/<run_name>/).",
    )
    s3_conn_id: str = Field(
        "aws_default", description="Airflow AWS connection for s3:// locations (endpoint URL in "
        "its extra)."
    )
    protected_prefixes: list[str] = Field(
        ["completions/"],
        description="Locations no run may write in, contain or be inside (the original data); "
        "a relative prefix applies under every bucket and directory.",
    )
    data_roots: list[str] = Field(
        [str(SAMPLE_DATA_DIR)],
        description="Local directories that local source, tokenizer and dedupe paths of a run "
        "must be inside.",
    )
    allowed_hub_datasets: list[str] = Field(
        [], description="Hub datasets a new source may name as hub_id ('org/name', or "
        "'org/name@revision' to pin the revision); empty: any 'org/name' id.",
    )
    allowed_tokenizers: list[str] = Field(
        [], description="Hub ids a run may choose as tokenizer_path besides the allowed models "
        "(a local tokenizer_path must be inside a data root).",
    )
    dedupe_roots: list[str] = Field(
        [], description="s3:// locations that dedupe_against sets of a run must lie under "
        "(local ones must be inside a data root); empty: no s3:// dedupe set.",
    )
    source_catalogue: dict[str, SourceSettings] = Field(
        default_factory=bundled_catalogue,
        description="Sources a run may choose by name (object of name -> source).",
    )

    lease_ttl_s: float = Field(
        120.0, ge=10.0, le=3600.0,
        description="How long a shard's lease outlives its holder's last renewal: a dead "
        "try's shard is taken over after this long (renewed every quarter of it).",
    )
    max_active_shards: int = Field(
        3, ge=1, description="Shards generated at once per run (they share the servers). Read "
        "when the DAG file is parsed: it is a task argument.")
    defer_health_gate: bool = Field(
        True, description="Wait for servers in the triggerer (no worker slot held while a model "
        "loads); false where no triggerer runs. Read when the DAG file is parsed.")

    @field_validator("output_root")
    @classmethod
    def _normalised_root(cls, value: str) -> str:
        # The normalised form is what stores open: checked and written locations are equal.
        from include.storage.errors import StoreError
        from include.storage.locations import normalize_location

        try:
            return normalize_location(value)
        except StoreError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("protected_prefixes")
    @classmethod
    def _usable_prefixes(cls, value: list[str]) -> list[str]:
        from include.storage.errors import StoreError
        from include.storage.locations import check_protected_prefixes

        try:
            check_protected_prefixes(value)
        except StoreError as exc:
            raise ValueError(str(exc)) from None
        return value

    @classmethod
    def load(cls) -> DeploymentSettings:
        """Read the deployment settings from the environment; raise SettingsError if wrong."""
        try:
            return cls()
        except ValidationError as exc:
            problems = describe(
                exc, what="deployment setting", known=cls.model_fields,
                where_configured=lambda name: f" (environment variable {env_name(name)})")
        raise_all(problems)  # outside the except block: the log shows our words only
        raise AssertionError("unreachable: a validation error always names a problem")

    @classmethod
    def parse_time_values(cls) -> ParseTimeValues:
        """Return only the ``PARSE_TIME_SETTINGS``, read from the environment alone.

        What the DAG file may read when it is parsed: no other setting is validated (no source
        catalogue, no path normalisation), no connection is read. Parsed as ``load`` parses
        them (``REGEN_DEFER_HEALTH_GATE=0`` is false); a wrong value raises SettingsError.
        """
        try:
            return ParseTimeValues(**_parse_time_model()().model_dump())
        except ValidationError as exc:
            problems = describe(
                exc, what="deployment setting", known=cls.model_fields,
                where_configured=lambda name: f" (environment variable {env_name(name)})")
        raise_all(problems)
        raise AssertionError("unreachable: a validation error always names a problem")

    def check(self) -> None:
        """Raise SettingsError for values that are each valid but unusable together."""
        problems = []
        for i, h in enumerate(self.gpu_hosts):
            if not h.gpus:
                problems.append(f"deployment setting `gpu_hosts[{i}].gpus` is empty "
                                f"(environment variable {env_name('gpu_hosts')})")
        for name, src in self.source_catalogue.items():
            if src.name != name:
                problems.append(
                    f"deployment setting `source_catalogue.{name}`: its name is {src.name!r}; "
                    f"use the same name as the key ({env_name('source_catalogue')})")
        raise_all(problems)

    def is_deployment_setting(self, name: str) -> bool:
        """Return whether ``name`` is one of these settings."""
        return name in type(self).model_fields

    @functools.cached_property
    def api_key(self) -> str | None:
        """Return the servers' API key, masked in task logs (``include.sglang.hook``), or None."""
        from include.sglang.hook import SGLangHook

        return SGLangHook(self.sglang_conn_id).api_key()


class _EnvironmentOnly(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, case_sensitive=False)


@functools.cache
def _parse_time_model() -> type[BaseSettings]:
    """Return a settings model of the parse-time fields, each exactly as declared above."""
    fields: dict[str, Any] = {
        name: (DeploymentSettings.model_fields[name].annotation,
               copy.copy(DeploymentSettings.model_fields[name]))
        for name in PARSE_TIME_SETTINGS}
    return create_model("ParseTimeSettings", __base__=_EnvironmentOnly, **fields)


def inside_data_roots(path: str, roots: list[str]) -> bool:
    """Return whether ``path`` (after resolving links and ``..``) is inside one of ``roots``."""
    real = Path(os.path.realpath(path))
    for root in roots:
        r = Path(os.path.realpath(root))
        if real == r or r in real.parents:
            return True
    return False
