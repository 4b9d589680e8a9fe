"""What run and deployment settings share: where the repository and its samples are, the name
patterns and what each accepts, and the settings of one source dataset.

Apart from ``run.py`` and ``deployment.py`` so that each imports it without importing the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DATA_DIR = REPO_ROOT / "include" / "sample_data"

SourceKind = Literal[
    "auto", "infinity_instruct", "webinstructsub", "codefeedback", "metamathqa",
    "hermes_function_calling", "agentinstruct", "orca_agentinstruct", "agent_flan",
]
#: The output quality filters (``include.quality.QUALITY_FILTERS``), by name.
QualityFilter = Literal[
    "degenerate_repetition", "unclosed_think", "empty_answer", "invalid_tool_call_json",
    "near_duplicate",
]
MultiTurnPolicy = Literal["first_user", "until_first_trained_assistant", "until_last_user"]
# The look-ahead refuses a trailing newline, which `$` lets through in Python's `re` (used by
# Airflow's form validation) but not in JavaScript: one pattern, one meaning, everywhere.
NAME_PATTERN = r"^(?!.*\n)[a-z0-9][a-z0-9_\-]{0,63}$"
SHARD_RANGE_PATTERN = r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$"
#: What a value failing a pattern should have looked like, by field name.
PATTERN_ACCEPTED = {
    "name": "lowercase letters, digits, '_' and '-' (at most 64, starting with a letter or "
            "digit)",
    "run_name": "lowercase letters, digits, '_' and '-' (at most 64, starting with a letter "
                "or digit)",
    "shard_range": "shard numbers and ranges low-high, e.g. '120-179' or '0-9,42'",
    "reasoning_parser": "a parser name: letters, digits, '_' and '-'",
    "served_model_name": "letters, digits and ._/- (no spaces, no ':': SGLang exits at "
                         "start-up on a served name with ':', which it reserves for LoRA "
                         "adapters, 'model:adapter')",
}


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1)]


class SamplingVariants(BaseModel):
    """Sampling values to mix within one run; each prompt gets one value of each listed
    setting (``include.engine.variants``: crossed, by seed, the same on every try)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: list[Temperature] | None = Field(None, min_length=1, title="Temperatures")
    top_p: list[TopP] | None = Field(None, min_length=1, title="Top-p values")
    top_k: list[TopK] | None = Field(None, min_length=1, title="Top-k values")
    enable_thinking: list[bool] | None = Field(None, min_length=1, title="Thinking on/off")

    @model_serializer(mode="wrap")
    def _listed_only(self, handler: Any) -> dict[str, Any]:
        # Only the settings that vary: ``{}`` means one sampling, in the form and in records.
        return {k: v for k, v in handler(self).items() if v is not None}

    @model_validator(mode="after")
    def _distinct(self) -> SamplingVariants:
        for key, values in self.model_dump().items():
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"{key} lists a value twice: {values}")
        return self

    def mapping(self) -> dict[str, list]:
        """Return the listed settings and their values (what ``variants`` takes)."""
        return {k: list(v) for k, v in self.model_dump().items()}


class SourceSettings(BaseModel):
    """One source dataset: chosen by name from the deployment's catalogue, or a hub id or path.

    For a catalogue name only the sampling keys (quota, languages, exclude_sources,
    multi_turn, turns) may be given; the location comes from the catalogue.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, regex_engine="python-re")

    name: str = Field(..., title="Name", pattern=NAME_PATTERN,
                      description="A name from the deployment's source catalogue, or a new "
                      "short unique name (used in prompt ids) with hub_id or path.")
    kind: SourceKind = Field("auto", title="Kind",
                             description="Dataset layout; 'auto' recognises it from the columns.")
    path: str | None = Field(None, title="Local path",
                             description="A file, directory or glob of parquet/JSON/JSONL files "
                             "inside one of the deployment's data roots.")
    hub_id: str | None = Field(None, title="Hub id",
                               description="Hugging Face dataset id, read when no path is given.")
    config: str | None = Field(None, title="Config",
                               description="Dataset config (hub) and the config part of prompt "
                               "ids.")
    revision: str | None = Field(None, title="Revision",
                                 description="Hub revision (commit or tag) to pin.")
    split: str = Field("train", title="Split", description="Dataset split.")
    quota: int | None = Field(None, ge=0, title="Quota",
                              description="Most prompts kept from this source (seeded sample).")
    languages: list[str] | None = Field(None, title="Languages",
                                        description="Keep only rows in these languages (sources "
                                        "with a language column).")
    exclude_sources: list[str] = Field([], title="Excluded source values",
                                       description="Drop rows whose source column has one of "
                                       "these values (e.g. WebInstructSub 'socratic', CC BY-NC).")
    multi_turn: MultiTurnPolicy = Field(
        "first_user", title="Multi-turn policy",
        description="Which turns make the prompt: 'first_user' (system + first user turn), "
        "'until_first_trained_assistant' (every turn before the first assistant turn with "
        "loss=true), 'until_last_user' (every turn up to the last user turn).")
    turns: Literal["first", "all"] | None = Field(
        None, title="Turns",
        description="'all': regenerate whole conversations from this source (multi_turn is "
        "then not used); 'first': one answer per prompt. Empty: the run's turns.")

    #: Keys that say where a source is, as opposed to how its rows are sampled.
    LOCATION_KEYS: ClassVar[tuple[str, ...]] = (
        "kind", "path", "hub_id", "config", "revision", "split")
