"""The evaluation's settings: what the deployment allows (``REGEN_*``) and what a trigger asks.

``EvaluationDeployment`` reads ``REGEN_ALLOWED_DRAFTERS`` as ``DeploymentSettings`` reads
``REGEN_ALLOWED_MODELS`` (pydantic-settings, JSON in the environment); it belongs in
``DeploymentSettings`` once that module is open to this change. ``EvaluationRequest`` is the
trigger form's content, checked here so nothing from a conf reaches a shell or a path: drafters
are named, and only the deployment's names resolve to paths.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: ``spec_info.py`` builtins an evaluation may choose (UNO, DSPARK, FROZEN_KV_MTP left out).
Algorithm = Literal["DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class EvaluationDeployment(BaseSettings):
    """Deployment settings of the evaluation (environment only)."""

    model_config = SettingsConfigDict(env_prefix="REGEN_", frozen=True, case_sensitive=False,
                                      extra="ignore")

    allowed_drafters: dict[str, str] = Field(
        {}, description="Drafters an evaluation may load: name -> checkpoint directory, the "
        "same path on the GPU hosts and the workers (config.json is read from it).")


class SpeculativeSettings(BaseModel):
    """SGLang's speculative flags for one evaluation (``arg_groups/fields/spec.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Algorithm = "EAGLE3"
    num_steps: int | None = Field(None, ge=1, le=64)
    eagle_topk: int | None = Field(None, ge=1, le=64)
    num_draft_tokens: int | None = Field(None, ge=2, le=128)

    def flags(self, draft_path: str | None) -> list[str]:
        """The launch flags, each value a typed number or a deployment path."""
        out = ["--speculative-algorithm", self.algorithm]
        if draft_path is not None:
            out += ["--speculative-draft-model-path", draft_path]
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            value = getattr(self, name)
            if value is not None:
                out += [f"--speculative-{name.replace('_', '-')}", str(value)]
        return out


class EvaluationRequest(BaseModel):
    """What one evaluate_drafter run measures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_run: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    baseline: str
    candidates: list[str] = Field(min_length=1)
    speculative: SpeculativeSettings = SpeculativeSettings()
    temperatures: list[float] = Field([0.0], min_length=1)
    thinking: list[bool] = Field([True, False], min_length=1)
    max_tokens: int = Field(1024, ge=1, le=131072)
    concurrency: int = Field(8, ge=1, le=1024)
    target_only_pass: bool = True
    min_gain: float | None = Field(None, description="Fail unless every candidate's pooled "
                                   "acceptance length beats the baseline's by this much (the "
                                   "interval's lower end).")
    seed: int = 0

    @field_validator("baseline", "candidates")
    @classmethod
    def _names(cls, value: str | list[str]) -> str | list[str]:
        for name in [value] if isinstance(value, str) else value:
            if not _NAME.match(name):
                raise ValueError(f"drafter name {name!r}: letters, digits, '.', '_', '-'")
        return value

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, value: list[float]) -> list[float]:
        if any(not 0.0 <= t <= 2.0 for t in value):
            raise ValueError("temperatures must be in [0, 2]")
        return value

    @property
    def drafters(self) -> list[str]:
        return [self.baseline, *[c for c in self.candidates if c != self.baseline]]
