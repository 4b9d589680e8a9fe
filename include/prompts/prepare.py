"""The prepare stage: source rows in, deduplicated deterministic prompt shards out.

``prepare_prompts`` is the entry point (the DAG's prepare task calls it through
``plan.prepare_or_reuse``). Its parts, one module each:

- ``sources``: one source's per-row work, by the reference row path (``rows``) or a
  column-wise path (``columns``); its candidates are spooled to a local temporary file;
- ``workers``: the sources shared out between this process and one worker process;
- ``dedupe``: duplicates dropped over 16-byte keys, in settings order;
- ``shards``: quotas, the seeded shuffle, the shards cut and written;
- ``funnel``: where every row went, and the manifest.

Memory stays flat in the number of rows: only dedupe keys and file offsets stay in memory.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from include.layout import MANIFEST_KEY, PROMPTS_PREFIX
from include.prompts.dedupe import Kept, KeySet, dedupe, load_existing_keys
from include.prompts.funnel import SourceFunnel, build_manifest, format_funnel
from include.prompts.held_out import hold_out, write_held_out
from include.prompts.readers import resolve_files
from include.prompts.shards import apply_quota, plan_shards, shuffled_order, write_shards
from include.prompts.sources import control_tokens, length_counter, map_source
from include.prompts.workers import map_in_order, usable_cpus
from include.settings import RunSettings, SourceSettings
from include.storage import Store, open_store

log = logging.getLogger(__name__)

#: Below this many bytes of local source files the stage runs in one process: starting a
#: worker costs more than it saves on small inputs (tests set it to 0 to run the worker).
PARALLEL_MIN_BYTES = 64 << 20


def prepare_prompts(settings: RunSettings, store: Store | None = None) -> dict[str, Any]:
    """Write ``prompts/shard-NNNNN.jsonl`` and ``prompts/manifest.json`` create-only (run again
    with other inputs or settings, it fails instead of overwriting); return the manifest."""
    with _gc_paused():
        return _prepare(settings, store)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (as it was before, after it).

    The per-row work allocates millions of short-lived lists and tuples that form no cycles
    (reference counting frees them); the collector's passes over them, ever longer as the
    stage's long-lived containers grow, cost a large share of the time and free nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _prepare(settings: RunSettings, store: Store | None) -> dict[str, Any]:
    store = store or open_store(
        settings.run_uri,
        s3_conn_id=settings.deployment.s3_conn_id,
        protected_prefixes=tuple(settings.deployment.protected_prefixes),
    )
    unit, _ = length_counter(settings)
    log.info(
        "prepare: %d sources -> %s; shard_size=%d seed=%d prompt length in %s [%s, %s]",
        len(settings.sources),
        store.uri(PROMPTS_PREFIX),
        settings.shard_size,
        settings.seed,
        unit,
        settings.min_prompt_length,
        settings.max_prompt_length or "no bound",
    )
    control = control_tokens(settings)
    if isinstance(control, str):
        log.warning("prepare: rows holding the target's control tokens cannot be dropped: %s; "
                    "set tokenizer_path to a tokenizer the workers can read", control)
    existing = load_existing_keys(settings)
    seen_keys = KeySet()
    funnels: list[SourceFunnel] = []
    with tempfile.TemporaryDirectory(prefix="prepare-") as tmp:
        kept: list[Kept] = []
        held: list[tuple[str, list[bytes]]] = []
        selected: list[Sequence[int]] = []
        sources = settings.sources
        sizes = [_source_bytes(source) for source in sources]
        parallel = usable_cpus() >= 2 and sum(sizes) >= PARALLEL_MIN_BYTES
        # The largest sources first: the two processes then end at about the same time.
        claims = sorted(range(len(sources)), key=lambda si: -sizes[si])
        read = functools.partial(map_source, settings, tmp)
        for si, candidates in enumerate(
            map_in_order(len(sources), read, parallel=parallel, claim_order=claims)
        ):
            source, funnel = sources[si], candidates.funnel
            kept.append(dedupe(candidates, existing, seen_keys))
            del candidates  # its keys live on in seen_keys only where kept
            available, lines = hold_out(kept[si], source, settings, funnel)
            held.append((source.name, lines))
            selected.append(apply_quota(source, funnel, available, settings.seed))
            funnel.check()
            funnels.append(funnel)
            log.info(
                "source %s (%s): read %d, kept %d",
                source.name,
                funnel.kind,
                funnel.read,
                funnel.kept,
            )
        del seen_keys
        order = shuffled_order(selected, settings.seed)
        del selected
        n_shards = plan_shards(len(order), settings.shard_size)
        shards = write_shards(store, kept, order, settings.shard_size, n_shards)
    held_out = write_held_out(store, settings, held)

    manifest = build_manifest(settings, unit, funnels, shards, control, held_out)
    store.write_new(MANIFEST_KEY, json.dumps(manifest, indent=2).encode() + b"\n")
    log.info("prepare funnel:\n%s", format_funnel(manifest))
    log.info(
        "prepare: wrote %d prompts in %d shards to %s; %d held out for evaluation in %s",
        manifest["totals"]["kept"],
        len(shards),
        store.uri(PROMPTS_PREFIX),
        held_out["count"],
        store.uri(held_out["key"]),
    )
    return manifest


def _source_bytes(source: SourceSettings) -> float:
    """Return the size of a source's files: the estimate of its share of the work."""
    if not source.path:
        return math.inf  # a hub download and its rows: large as a rule
    try:
        return sum(os.path.getsize(f) for f in resolve_files(source))
    except (OSError, RuntimeError):
        return 0  # reported by the read itself, in its turn
