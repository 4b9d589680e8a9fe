"""Prepare or reuse a run's prompt shards, and pick the shards left to generate.

A run's prompt shards live at ``<run>/prompts/``. If they are already there (an earlier run
with the same ``run_name``), they are reused when they were prepared with the same
preparation settings, and the run refuses to start otherwise: the existing shards are never
overwritten and never silently mixed with other settings. ``shard_range`` then picks shards,
and shards whose tokenized manifest already exists are reported complete and skipped, unless
``force_regenerate`` sends the selected shards to a new location under the run. The
prepare task around it (stores, the stagger, Airflow's mapping limit) is
``include.pipeline.prepare_prompts``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from include.layout import MANIFEST_KEY, shard_id, tokenized_keys
from include.prompts.errors import PrepareError
from include.prompts.prepare import prepare_prompts
from include.prompts.schemas import UnknownLayoutError
from include.settings import PREPARATION_SETTINGS, RunSettings
from include.storage import Store

log = logging.getLogger(__name__)


def prepare_or_reuse(settings: RunSettings, store: Store) -> dict[str, Any]:
    """Return the prompt manifest of the run in ``store``, preparing the shards only if none
    exist yet."""
    if store.exists(MANIFEST_KEY):
        manifest = json.loads(store.read(MANIFEST_KEY))
        if manifest.get("preparation_fingerprint") == settings.fingerprint(PREPARATION_SETTINGS):
            log.info(
                "prompt shards already prepared at %s with the same preparation settings; "
                "reusing %d shards",
                store.uri(MANIFEST_KEY),
                len(manifest["shards"]),
            )
            return manifest
        raise PrepareError(
            f"prompt shards at {store.uri(MANIFEST_KEY)} were prepared with other settings "
            f"(different: {settings.preparation_differences(manifest)}). Use the same preparation "
            "settings to reuse them (e.g. for a shard_range backfill), or a new run_name."
        )
    return prepare_prompts(settings, store)


def select_shards(
    settings: RunSettings, manifest: dict[str, Any], outputs: Store
) -> dict[str, Any]:
    """Return the shards this run generates, and those it skips as already complete.

    A shard is complete when its tokenized manifest exists (the last file the shard's chain
    writes). Empty shards are never scheduled.
    """
    total = len(manifest["shards"])
    chosen = settings.shard_numbers(total)
    todo, complete = [], []
    for n in chosen:
        sid = shard_id(n)
        if manifest["shards"][n]["count"] == 0:
            continue
        if outputs.exists(tokenized_keys(n)[2]):  # its manifest: written last
            complete.append(sid)
        else:
            todo.append(sid)
    log.info(
        "shards: %d in the run, %d selected (%s), %d already complete and skipped%s, %d to run",
        total,
        len(chosen),
        settings.shard_range or "all",
        len(complete),
        f" ({', '.join(complete[:10])}{'...' if len(complete) > 10 else ''})" if complete else "",
        len(todo),
    )
    return {"shards": todo, "complete": complete, "total_shards": total}


#: Errors of a run's settings or data: the same inputs give the same error (no retry helps).
PERMANENT_ERRORS: tuple[type[Exception], ...] = (PrepareError, UnknownLayoutError)
