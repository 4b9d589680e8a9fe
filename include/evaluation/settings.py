"""What one ``evaluate_drafter`` run measures: the trigger form's content, checked.

Nothing from a conf reaches a shell or a path: drafters are names, and only the deployment's
``allowed_drafters`` (``DeploymentSettings``, ``REGEN_ALLOWED_DRAFTERS``) turns a name into a
checkpoint path; the dataset run is a name opened under the deployment's ``output_root``; the
servers' settings are bound through ``RunSettings`` (so the model must be an allowed one);
prompt sets are names too, resolved to files only by ``allowed_prompt_sets``
(``REGEN_ALLOWED_PROMPT_SETS``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from include.servers.expectations import SpeculativeLaunch

#: ``spec_info.py`` builtins an evaluation may choose (UNO, DSPARK, FROZEN_KV_MTP left out).
Algorithm = Literal["DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RUN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
#: The run settings the evaluation's servers are launched with (use the dataset run's own:
#: the split's answers came from that server). Bound through ``RunSettings``; None = its default.
SERVER_SETTINGS = ("model_path", "served_model_name", "context_length", "tp_size",
                   "mem_fraction_static", "reasoning_parser", "launch_timeout_s")


class EvaluationRequest(BaseModel):
    """What one evaluate_drafter run measures (the trigger form; None: the default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_run: str | None = Field(None, pattern=RUN_PATTERN)
    baseline: str
    candidates: list[str] = Field(min_length=1, max_length=8)
    #: Names of the deployment's ``allowed_prompt_sets`` measured beside the held-out split.
    prompt_sets: list[str] = Field([], max_length=16)
    algorithm: Algorithm = "EAGLE3"
    num_steps: int | None = Field(None, ge=1, le=64)
    eagle_topk: int | None = Field(None, ge=1, le=64)
    num_draft_tokens: int | None = Field(None, ge=2, le=128)
    temperatures: list[float] = Field([0.0], min_length=1, max_length=4)
    thinking: Literal["both", "on", "off"] = "both"
    max_tokens: int = Field(1024, ge=1, le=131072)
    concurrency: int = Field(8, ge=1, le=1024)
    target_only_pass: bool = True
    min_gain: float | None = Field(None, ge=-100.0, le=100.0)
    seed: int = Field(0, ge=0)
    model_path: str | None = None
    served_model_name: str | None = None
    context_length: int | None = None
    tp_size: int | None = None
    mem_fraction_static: float | None = None
    reasoning_parser: str | None = None
    launch_timeout_s: float | None = None

    @classmethod
    def from_params(cls, params: Any) -> EvaluationRequest:
        """Validate the form's params (a form field emptied is None: the default)."""
        values = {k: v for k, v in dict(params or {}).items()
                  if v is not None and not (k == "dataset_run" and v == "")}
        return cls.model_validate(values)

    @field_validator("baseline", "candidates", "prompt_sets")
    @classmethod
    def _names(cls, value: str | list[str], info: ValidationInfo) -> str | list[str]:
        what = "prompt set" if info.field_name == "prompt_sets" else "drafter"
        for name in [value] if isinstance(value, str) else value:
            if not _NAME.match(name):
                raise ValueError(f"{what} name {name!r}: letters, digits, '.', '_', '-'")
        return value

    @field_validator("temperatures")
    @classmethod
    def _temps(cls, value: list[float]) -> list[float]:
        if any(not 0.0 <= t <= 2.0 for t in value):
            raise ValueError("temperatures must be in [0, 2]")
        return value

    @property
    def drafters(self) -> list[str]:
        """The baseline, then each candidate once."""
        out = [self.baseline]
        out += [c for c in self.candidates if c not in out]
        return out

    @property
    def candidate_names(self) -> list[str]:
        return self.drafters[1:]

    @property
    def thinking_modes(self) -> list[bool]:
        return {"both": [True, False], "on": [True], "off": [False]}[self.thinking]

    def speculative(self, draft_path: str | None) -> SpeculativeLaunch:
        """The launch flags of a drafter pass; ``draft_path`` from the deployment only."""
        return SpeculativeLaunch(self.algorithm, draft_path, self.num_steps, self.eagle_topk,
                                 self.num_draft_tokens)

    def server_values(self) -> dict[str, Any]:
        """The run settings the servers are launched with (None: RunSettings' default)."""
        values = {k: getattr(self, k) for k in SERVER_SETTINGS if getattr(self, k) is not None}
        return {**values, "max_tokens": self.max_tokens}
