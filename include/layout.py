"""Shard names and every store key of a run (docs/data-layout.md), in one place.

Every stage names shards and finds their files through these functions, so the prepare stage,
the generation, the tokenization stage, the report and the monitor cannot disagree on a key.
No imports from ``include``: any module may import this one without forming an import circle.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

PROMPTS_PREFIX = "prompts"
#: The prepare stage's manifest: its funnel, and the list of prompt shards.
MANIFEST_KEY = f"{PROMPTS_PREFIX}/manifest.json"
#: The folders of a run's (or a regeneration's) outputs, each holding one entry per shard.
JOURNAL_PREFIX = "journal"
GENERATED_PREFIX = "generated"
TOKENIZED_PREFIX = "tokenized"
#: The trainer exports: one JSONL of ``{"input_ids", "loss_mask", ...}`` per shard, in a
#: folder of its own (speculators' ``prepare_data --data`` reads every .json/.jsonl of a
#: folder, so nothing else may live there), and the whole run in one file at the root
#: (SpecForge's ``data.prompts_path`` takes one file).
PRETOKENIZED_PREFIX = "pretokenized"
PRETOKENIZED_RUN = "pretokenized.jsonl"
#: One folder per Airflow run's report (``report_prefix``).
REPORT_PREFIX = "report"
#: A forced regeneration's outputs (``regeneration_prefix``), beside the run's own.
REGENERATIONS_PREFIX = "regenerations"
#: The suffix of every shard's manifest in ``generated/`` and ``tokenized/``: written last.
SHARD_MANIFEST_SUFFIX = ".manifest.json"
#: The report's machine-readable file (it says ``"passed"``) and its page.
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
REPORT_MARKDOWN = "report.md"
#: The held-out split (why: ``include/prompts/held_out.py``), a run of one shard nested in the
#: run's ``eval/`` folder (``eval_location``): a shard's keys under it, so the shard tasks
#: answer it as a shard and no training export (the run's own keys) can hold it.
EVAL_PREFIX = "eval"
EVAL_SHARD = "shard-00000"
EVAL_PROMPTS_KEY = f"{EVAL_PREFIX}/{PROMPTS_PREFIX}/{EVAL_SHARD}.jsonl"
EVAL_MANIFEST_KEY = f"{EVAL_PREFIX}/manifest.json"
#: The dataset card's file name (Hugging Face's dataset-card convention).
CARD_NAME = "README.md"

_SHARD_PREFIX = "shard-"
#: Every tokenized shard's parquet and conversations file, as globs relative to the run's
#: outputs (the dataset card's ``data_files`` and what it tells a reader to load).
TOKENIZED_PARQUET_GLOB = f"{TOKENIZED_PREFIX}/{_SHARD_PREFIX}*.parquet"
CONVERSATIONS_GLOB = f"{TOKENIZED_PREFIX}/{_SHARD_PREFIX}*.conversations.jsonl"


class Split(StrEnum):
    """Which split a plan entry's shard belongs to: training, or the held-out split."""

    TRAIN = "train"
    HELD_OUT = "held_out"


def eval_location(uri: str) -> str:
    """Return the held-out split's location inside the outputs (or prompts) location ``uri``."""
    return f"{uri.rstrip('/')}/{EVAL_PREFIX}"


def eval_key(key: str) -> str:
    """Return the run-relative key of ``key`` inside the held-out split (``eval/<key>``)."""
    return f"{EVAL_PREFIX}/{key}"


def run_folder(run_id: str) -> str:
    """Return the folder name of one Airflow run's files (its report, a forced regeneration).

    Readable where the run id already is a safe name; otherwise the readable part plus a hash
    of the whole id, so two run ids never share a folder (``a:b`` and ``a+b`` would both read
    ``a_b``) and no id maps to ``.``, ``..`` or nothing.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_.")[:120]
    if safe == run_id and safe not in ("", ".", ".."):
        return safe
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{safe or 'run'}-{digest}"


def shard_id(index: int) -> str:
    """Return the id of shard ``index`` (``shard-00042``), used in keys, logs and task names."""
    return f"{_SHARD_PREFIX}{index:05d}"


def shard_index(shard: str) -> int:
    """Return the index of a shard id (``shard-00042`` -> 42)."""
    digits = shard.removeprefix(_SHARD_PREFIX)
    if not shard.startswith(_SHARD_PREFIX) or not digits.isdigit():
        raise ValueError(f"not a shard id: {shard!r} (expected e.g. 'shard-00042')")
    return int(digits)


def shard_key(index: int) -> str:
    """Return the store key of prompt shard ``index``."""
    return f"{PROMPTS_PREFIX}/{shard_id(index)}.jsonl"


def generated_keys(index: int) -> tuple[str, str]:
    """Return the store keys of shard ``index``'s completion records and their manifest."""
    name = f"{GENERATED_PREFIX}/{shard_id(index)}"
    return f"{name}.jsonl", f"{name}{SHARD_MANIFEST_SUFFIX}"


def facts_key(index: int) -> str:
    """Return the key of shard ``index``'s report facts (``include.reporting.facts``)."""
    return f"{GENERATED_PREFIX}/{shard_id(index)}.facts.json"


def output_keys(shard: str) -> tuple[str, str]:
    """Return the store keys of a shard's completions file and its manifest, by shard id."""
    return generated_keys(shard_index(shard))


def tokenized_keys(index: int) -> tuple[str, str, str]:
    """Return the parquet, conversations and manifest keys of tokenized shard ``index``."""
    name = f"{TOKENIZED_PREFIX}/{shard_id(index)}"
    return f"{name}.parquet", f"{name}.conversations.jsonl", f"{name}{SHARD_MANIFEST_SUFFIX}"


def pretokenized_key(index: int) -> str:
    """Return the key of tokenized shard ``index``'s trainer export (``pretokenized/``)."""
    return f"{PRETOKENIZED_PREFIX}/{shard_id(index)}.jsonl"


def pretokenized_run_key() -> str:
    """Return the key of the whole run's trainer export, at the root of its outputs."""
    return PRETOKENIZED_RUN


def journal_prefix(shard: str) -> str:
    """Return the store prefix of a shard's journal segments (``journal/shard-NNNNN``)."""
    return f"{JOURNAL_PREFIX}/{shard}"


#: A journal segment's name: ``part-<ns>-<generation:08d><writer hex12>-<seq:06d>.jsonl``
#: (the generation is absent for a writer without a lease); ``durability.fencing`` reads it.
SEGMENT_NAME = re.compile(r"part-\d+-(\d{8})?([0-9a-f]{12})-(\d+)\.jsonl$")


def segment_key(prefix: str, now_ns: int, writer: str, seq: int) -> str:
    """Return the key of journal segment ``seq`` of ``writer`` (``prefix`` ends with ``/``)."""
    return f"{prefix}part-{now_ns:020d}-{writer}-{seq:06d}.jsonl"


def started_key(shard: str) -> str:
    """Return the key of the marker a shard writes when its generation starts."""
    return f"{journal_prefix(shard)}/started"


#: The suffix of a shard's settings record beside its journal folder (``journal_settings_key``).
JOURNAL_SETTINGS_SUFFIX = ".settings.json"


def journal_settings_key(shard: str) -> str:
    """Return ``journal/<shard>.settings.json``: beside the journal folder, so one delimiter
    listing of ``journal/`` finds every shard's record without touching a segment."""
    return f"{journal_prefix(shard)}{JOURNAL_SETTINGS_SUFFIX}"


@dataclass(frozen=True)
class ShardKeys:
    """Every key of one shard, built once from its id: what its journal, its start marker,
    its settings record and its published output are called (the functions above)."""

    shard: str
    index: int
    journal: str
    started: str
    settings: str
    completions: str
    manifest: str


def shard_keys(shard: str) -> ShardKeys:
    """Return the keys of shard ``shard`` (``shard-00042``); raises ValueError for a non-id."""
    index = shard_index(shard)
    completions, manifest = generated_keys(index)
    return ShardKeys(shard, index, journal_prefix(shard), started_key(shard),
                     journal_settings_key(shard), completions, manifest)


def compacted_keys(prefix: str) -> tuple[str, str]:
    """Return a published journal's object and index keys, beside its folder (so a reader of
    every key under it still reads segments); the index is written second, vouching for both."""
    base = prefix.rstrip("/")
    return f"{base}.compacted.jsonl", f"{base}.compacted.json"


def lease_prefix(prefix: str) -> str:
    """Return the folder of a shard's lease generations under journal prefix ``prefix``."""
    return f"{prefix}/lease/"


def lease_key(prefix: str, generation: int) -> str:
    """Return the key of lease generation ``generation`` under journal prefix ``prefix``."""
    return f"{lease_prefix(prefix)}{generation:08d}.json"


def released_key(prefix: str, generation: int) -> str:
    """Return the key of the marker that releases lease generation ``generation``."""
    return f"{lease_prefix(prefix)}{generation:08d}.released"


def beats_prefix(prefix: str, generation: int) -> str:
    """Return the prefix of generation ``generation``'s renewals (apart from ``lease/``, so
    listing the generations stays a few keys however long a holder runs)."""
    return f"{prefix}/beats/{generation:08d}/"


def beat_key(prefix: str, generation: int, n: int) -> str:
    """Return the key of renewal ``n`` of lease generation ``generation``."""
    return f"{beats_prefix(prefix, generation)}{n:08d}"


def report_prefix(run_id: str) -> str:
    """Return ``report/<safe run id>/``: a later backfill of the run writes its own report."""
    return f"{REPORT_PREFIX}/{run_folder(run_id)}/"


def card_key() -> str:
    """Return the key of the dataset card at the root of a run's outputs (``README.md``)."""
    return CARD_NAME


def report_card_key(run_id: str) -> str:
    """Return the key of the dataset card kept with one Airflow run's report."""
    return report_prefix(run_id) + CARD_NAME


def regeneration_prefix(run_id: str) -> str:
    """Return where a forced regeneration of Airflow run ``run_id`` writes, under the run."""
    return f"{REGENERATIONS_PREFIX}/{run_folder(run_id)}"
