"""The held-out split of a dataset run: ``include.layout.EVAL_PROMPTS_KEY`` + its manifest.

Written by the prepare stage (``include/prompts/held_out.py``); each line is a prompt record
of the same schema as the run's prompt shards (``id``, ``source``, ``messages``, ``metadata``,
maybe ``turns`` / ``call_format``). The manifest names at least ``split``, ``seed``,
``per_source`` and ``count``; both are checked against each other, so a truncated file is not
measured as if it were the split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from include.layout import EVAL_MANIFEST_KEY as MANIFEST_KEY
from include.layout import EVAL_PROMPTS_KEY as PROMPTS_KEY
from include.storage import Store

_MANIFEST_KEYS = ("split", "seed", "per_source", "count")


class SplitError(ValueError):
    """The run has no usable held-out split."""


@dataclass(frozen=True)
class EvalSplit:
    """The split's manifest and its prompt records, in file order."""

    seed: int
    per_source: dict[str, int]
    prompts: list[dict[str, Any]]

    @property
    def count(self) -> int:
        return len(self.prompts)


def has_split(store: Store) -> bool:
    """Return whether the run at ``store`` has a held-out split (both files)."""
    return store.exists(MANIFEST_KEY) and store.exists(PROMPTS_KEY)


def load_split(store: Store) -> EvalSplit:
    """Read and check the split; raise SplitError naming what is missing or inconsistent."""
    if not has_split(store):
        raise SplitError(
            f"the dataset run at {store.uri('')} has no held-out split ({MANIFEST_KEY} and "
            f"{PROMPTS_KEY}): only runs prepared with a held-out split can be evaluated")
    manifest = json.loads(store.read(MANIFEST_KEY))
    missing = [k for k in _MANIFEST_KEYS if k not in manifest]
    if missing or manifest.get("split") != "eval":
        raise SplitError(f"{store.uri(MANIFEST_KEY)} is not an eval split manifest "
                         f"(missing {missing}, split {manifest.get('split')!r})")
    prompts = [json.loads(line) for line in store.iter_lines(PROMPTS_KEY) if line.strip()]
    counted: dict[str, int] = {}
    for record in prompts:
        if not isinstance(record.get("id"), str) or not isinstance(record.get("messages"), list):
            raise SplitError(f"{store.uri(PROMPTS_KEY)}: a record without id or messages")
        counted[record.get("source", "")] = counted.get(record.get("source", ""), 0) + 1
    expected = {k: v for k, v in manifest["per_source"].items() if v}  # a source gave none
    if not prompts:
        raise SplitError(f"{store.uri(MANIFEST_KEY)}: the held-out split is empty (the run was "
                         "prepared with held_out_per_source 0, or its sources were too small)")
    if len(prompts) != manifest["count"] or counted != expected:
        raise SplitError(
            f"{store.uri(PROMPTS_KEY)} holds {len(prompts)} prompts {counted}, its manifest "
            f"says {manifest['count']} {manifest['per_source']}: refusing a partial split")
    return EvalSplit(int(manifest["seed"]), dict(manifest["per_source"]), prompts)
