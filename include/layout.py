"""Shard names and the store keys of a run's shards (docs/data-layout.md), in one place.

Every stage names shards and finds their files through these functions, so the prepare stage,
the generation and the tokenization stage cannot disagree on a key. No imports from
``include``: any module may import this one without forming an import circle.
"""

from __future__ import annotations

import hashlib
import re

PROMPTS_PREFIX = "prompts"
#: The prepare stage's manifest: its funnel, and the list of prompt shards.
MANIFEST_KEY = f"{PROMPTS_PREFIX}/manifest.json"

_SHARD_PREFIX = "shard-"


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
    name = f"generated/{shard_id(index)}"
    return f"{name}.jsonl", f"{name}.manifest.json"


def tokenized_keys(index: int) -> tuple[str, str, str]:
    """Return the parquet, conversations and manifest keys of tokenized shard ``index``."""
    name = f"tokenized/{shard_id(index)}"
    return f"{name}.parquet", f"{name}.conversations.jsonl", f"{name}.manifest.json"
