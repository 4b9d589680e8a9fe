"""The held-out split: prompts no training export holds, to measure drafters on the run's data.

A drafter validated on off-policy text misleads (speculators #677); one trained with thinking
on collapses with it off (z-lab/dflash #60). So every run keeps, per source and per sampling
variant, ``held_out_per_source`` of its deduplicated prompts out of the shards, chosen by a
seeded draw, and writes them to ``include.layout.EVAL_PROMPTS_KEY`` (a shard of the run
nested in ``eval/``, the shards' record schema: the shard tasks answer it there) with
``eval/manifest.json``. They are chosen after dedupe and before quotas: no training prompt
equals one, and a quota samples from the rest. The split is written once, with the shards,
create-only: a resume, a retry or a backfill reuses it (``plan.prepare_or_reuse``), so no
prompt ever crosses the line. At most a tenth of a source's prompts is held out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from include.engine.variants import variant_name, variant_of
from include.layout import EVAL_MANIFEST_KEY, EVAL_PROMPTS_KEY
from include.prompts.dedupe import Kept
from include.prompts.funnel import SourceFunnel
from include.settings import RunSettings, SourceSettings
from include.storage import Store, sha256_hex

#: The funnel reason of a prompt kept out of the shards for the held-out split.
HELD_OUT = "held_out"
#: The largest share of a source's prompts the split may take.
MAX_SHARE = 0.1


def hold_out(kept: Kept, source: SourceSettings, settings: RunSettings,
             funnel: SourceFunnel) -> tuple[Sequence[int], list[bytes]]:
    """Return the indices of ``kept`` left for training and the held-out prompts' lines.

    Counts the held-out prompts in the funnel (``held_out``). With no split (the setting 0, or
    a source too small for one prompt per variant), every index is left: ``range(n)``.
    """
    n = len(kept.starts)
    variants = settings.sampling_variants.model_dump(mode="json")
    names = _variant_names(variants)
    per_variant = min(settings.held_out_per_source, math.floor(n * MAX_SHARE) // len(names))
    if per_variant <= 0:
        return range(n), []
    counts: Counter[str] = Counter()
    chosen: dict[int, tuple[str, bytes]] = {}  # index: (prompt id, its line)
    fd = os.open(kept.path, os.O_RDONLY)
    try:
        # A seeded walk in random order, taking each prompt whose variant still needs one.
        for i in _order(settings.seed, source.name, n).tolist():
            line = os.pread(fd, int(kept.lengths[i]), int(kept.starts[i]))
            rid = json.loads(line)["id"]
            name = variant_name(variant_of(rid, settings.seed, variants))
            if counts[name] < per_variant:
                counts[name] += 1
                chosen[i] = (rid, line)
                if len(chosen) == per_variant * len(names):
                    break
    finally:
        os.close(fd)
    for i in sorted(chosen):
        funnel.drop(HELD_OUT, chosen[i][0])
    funnel.kept -= len(chosen)
    left = np.setdiff1d(np.arange(n, dtype=np.int64), np.fromiter(chosen, np.int64))
    return left.tolist(), [chosen[i][1] for i in sorted(chosen)]


def _variant_names(variants: dict[str, list[Any]]) -> list[str]:
    """Return the name of every sampling variant of the run (one, unnamed, when none)."""
    keys = list(variants)
    return [variant_name(dict(zip(keys, values, strict=True)))
            for values in itertools.product(*(variants[k] for k in keys))] or [""]


def _order(seed: int, source: str, n: int) -> np.ndarray:
    digest = hashlib.blake2b(f"{seed}\0held_out\0{source}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "big")).permutation(n)


def write_held_out(store: Store, settings: RunSettings,
                   held: list[tuple[str, list[bytes]]]) -> dict[str, Any]:
    """Write the split's prompts and ``eval/manifest.json`` (create-only); return the
    manifest's summary for the prompt manifest. ``held``: (source, lines) in settings order."""
    data = b"".join(line for _, lines in held for line in lines)
    per_source = {name: len(lines) for name, lines in held}
    per_variant: Counter[str] = Counter()
    variants = settings.sampling_variants.model_dump(mode="json")
    for _, lines in held:
        for line in lines:
            per_variant[variant_name(variant_of(json.loads(line)["id"], settings.seed,
                                                variants))] += 1
    manifest = {
        "split": "eval", "seed": settings.seed,
        "held_out_per_source": settings.held_out_per_source, "max_share": MAX_SHARE,
        "count": sum(per_source.values()), "per_source": per_source,
        "per_variant": dict(sorted(per_variant.items())), "sampling_variants": variants,
        "key": EVAL_PROMPTS_KEY, "bytes": len(data), "sha256": sha256_hex(data),
    }
    store.write_new(EVAL_PROMPTS_KEY, data)
    store.write_new(EVAL_MANIFEST_KEY, json.dumps(manifest, indent=2).encode() + b"\n")
    return {k: manifest[k] for k in ("key", "count", "per_source", "per_variant", "sha256")}
