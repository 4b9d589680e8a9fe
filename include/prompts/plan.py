"""Decide what a run does: prepare or reuse prompt shards, and which shards to generate.

A run's prompt shards live at ``<run>/prompts/``. If they are already there (an earlier run
with the same ``run_name``), they are reused when they were prepared with the same
preparation settings, and the run refuses to start otherwise: the existing shards are never
overwritten and never silently mixed with other settings. ``shard_range`` then picks shards,
and shards whose tokenized manifest already exists are reported complete and skipped, unless
``force_regenerate`` sends the selected shards to a new location under the run.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from include.layout import MANIFEST_KEY, run_folder, shard_id, shard_index, tokenized_keys
from include.prompts.errors import PrepareError
from include.prompts.prepare import prepare_prompts
from include.prompts.schemas import UnknownLayoutError
from include.settings import PREPARATION_SETTINGS, RunSettings, SettingsError
from include.storage import Store, open_store

log = logging.getLogger(__name__)


def outputs_uri(settings: RunSettings, run_id: str) -> str:
    """Return where this run writes journals, completions and tokenized shards.

    Normally the run's own location; with ``force_regenerate`` a fresh folder named after the
    Airflow run id, so earlier outputs of the same shards stay untouched.
    """
    if not settings.force_regenerate:
        return settings.run_uri
    return f"{settings.run_uri}/regenerations/{run_folder(run_id)}"


def open_run_store(settings: RunSettings, uri: str | None = None) -> Store:
    """Return the store at ``uri`` (default: the run's location), protected prefixes enforced."""
    return open_store(
        uri or settings.run_uri,
        s3_conn_id=settings.deployment.s3_conn_id,
        protected_prefixes=tuple(settings.deployment.protected_prefixes),
    )


def prepare_or_reuse(settings: RunSettings, store: Store | None = None) -> dict[str, Any]:
    """Return the prompt manifest of the run, preparing the shards only if none exist yet."""
    store = store or open_run_store(settings)
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


def max_map_length() -> int:
    """Return how many items Airflow maps one task over here (``core.max_map_length``)."""
    from airflow.sdk.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)


def check_map_length(settings: RunSettings, todo: list[str], total: int,
                     limit: int | None = None) -> None:
    """Refuse, before any server starts, a run mapping more shards than Airflow allows.

    The message says exactly what to do: run the shards in parts with ``shard_range`` (the
    prompt shards are prepared once and reused), or raise the deployment's limit.
    """
    limit = max_map_length() if limit is None else limit
    if len(todo) <= limit:
        return
    first, last = shard_index(todo[0]), shard_index(todo[-1])
    parts = [f"'{lo}-{min(lo + limit, last + 1) - 1}'" for lo in range(first, last + 1, limit)]
    raise SettingsError(
        f"setting `shard_range` ({settings.shard_range or 'all'}): this run would generate "
        f"{len(todo)} of the {total} shards, more than Airflow maps one task over here "
        f"(core.max_map_length = {limit}). The prompts are prepared and kept; run the shards "
        f"in parts with shard_range {', then '.join(parts[:3])}{' ...' if len(parts) > 3 else ''}"
        f" (same run_name), or ask whoever deploys to set AIRFLOW__CORE__MAX_MAP_LENGTH to at "
        f"least {len(todo)} on the scheduler and workers")


def stagger(shard_ids: list[str], shards_in_flight: int) -> list[dict[str, Any] | None]:
    """Return, per shard, the progress of the first shard it waits for before starting.

    Shards in flight share the servers equally, so shards that start together also drain
    together, and the GPUs idle at every such boundary. The first wave therefore starts
    staggered: shard ``p`` (``0 < p < shards_in_flight``) waits until the first shard has
    finished ``p / shards_in_flight`` of its prompts. Later shards start as earlier ones
    finish, so the offsets persist and each drain overlaps the others' steady work.
    """
    first = shard_ids[0] if shard_ids else None
    return [
        {"shard_id": first, "fraction": round(p / shards_in_flight, 4)}
        if 0 < p < shards_in_flight
        else None
        for p in range(len(shard_ids))
    ]


#: Errors of a run's settings or data: the same inputs give the same error (no retry helps).
PERMANENT_ERRORS: tuple[type[Exception], ...] = (PrepareError, UnknownLayoutError)


def plan_run(settings: RunSettings, run_id: str, shards_in_flight: int = 1) -> list[dict[str, Any]]:
    """Prepare or reuse the prompt shards; return what the per-shard task group maps over.

    One ``{"shard_id", "outputs_uri", "wait_for"}`` per shard to run (``wait_for``: see
    ``stagger``). This is the prepare task's whole body.
    """
    manifest = prepare_or_reuse(settings)
    outputs = outputs_uri(settings, run_id)
    plan = select_shards(settings, manifest, open_run_store(settings, outputs))
    check_map_length(settings, plan["shards"], plan["total_shards"])
    log.info("outputs of this run go to %s", outputs)
    waits = stagger(plan["shards"], shards_in_flight)
    return [
        {"shard_id": sid, "outputs_uri": outputs, "wait_for": wait}
        for sid, wait in zip(plan["shards"], waits, strict=True)
    ]
