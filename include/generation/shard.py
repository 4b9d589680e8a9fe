"""Run one prompt shard of a run through the engine, and build the shard's output files.

The generate and upload tasks' stage (``include.pipeline.generate`` / ``upload`` call it):
read the prompts, wait for a slot, open the writer, run the engine; then publish. Durability
(the journal, the one writer per shard: its story is ``include.durability``'s docstring) is
reached through its one door, ``include.durability.door.ShardDurability``. Whatever Airflow is
asked comes in as a callable (``is_live``, ``slot_free``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from include.durability.door import ShardDurability
from include.engine.config import EngineConfig
from include.engine.dispatch import run_shard
from include.engine.outcome import check_accounting
from include.engine.startup import PromptCounter
from include.jsonl import escape_breaks
from include.layout import MANIFEST_KEY, shard_index
from include.outcomes import PromptStatus
from include.prompts import read_shard_by_id
from include.reporting.facts import encode_facts
from include.settings import RunSettings
from include.storage import Store, open_store, sha256_hex

log = logging.getLogger(__name__)


def generate_shard(
    settings: RunSettings,
    shard_id: str,
    server_urls: list[str],
    store: Store | None = None,
    prompts_store: Store | None = None,
    wait_for: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    is_live: Callable[[str], bool] | None = None,
    slot_free: Callable[[], bool] | None = None,
    lease_ttl_s: float | None = None,
    **engine_overrides: Any,
) -> dict[str, Any]:
    """Generate a shard's completions into its journal; return a summary for XCom and logs.

    ``store`` is where outputs go (default: the run's location), ``prompts_store`` where the
    prompt shards are (default: ``store``). A published shard is not run again; otherwise the
    engine resumes from the journal in ``store``, so a retry on any worker picks up where the
    last try stopped. With ``slot_free`` (asked of Airflow by the pipeline) the shard is
    queued ahead: set up first (tokenizer, prompts), it sends its first request as soon as a
    slot frees. ``wait_for`` (``{"shard_id", "fraction"}``, see
    ``include.pipeline.prepare_prompts.stagger``) delays the start until that shard has
    finished that share of its prompts. ``run_id``, ``is_live`` and ``lease_ttl_s`` are the
    writer's turn (``ShardDurability.open``); the summary's ``"lease"`` is the fencing token
    ``publish_shard`` checks.
    """
    store = store or open_store(settings.run_uri)
    prompts_store = prompts_store or store
    durability = ShardDurability(store, shard_id)
    manifest = durability.published(settings)  # refuses a journal under other settings first
    if manifest is not None:
        log.info("%s: already generated (%s); nothing to do", shard_id,
                 store.uri(durability.keys.manifest))
        return _already_done(shard_id, manifest)
    # Loaded on a thread while the prompts are read and the servers asked; the first
    # requests need not wait for it (``startup``).
    counter = PromptCounter(settings.tokenizer_path or settings.model_path,
                            settings.enable_thinking)
    prompts = read_shard_by_id(prompts_store, shard_id)
    config = EngineConfig.from_settings(settings, **engine_overrides)
    if slot_free is not None:
        wait_for_slot(shard_id, slot_free)
    with durability.open(settings, run_id=run_id, is_live=is_live, ttl_s=lease_ttl_s,
                         earlier=prompts_store) as journal:
        if journal is None:  # published meanwhile by another run
            return _already_done(shard_id, durability.published())
        if wait_for:
            wait_for_progress(store, prompts_store, shard_id, wait_for["shard_id"],
                              wait_for["fraction"])
        log.info(
            "%s: %d prompts -> %d servers %s | model %s, context_length %d, max_tokens cap %d, "
            "concurrency %s (start %d per server) | journal %s",
            shard_id, len(prompts), len(server_urls), server_urls, config.model,
            config.context_length, config.max_tokens, config.concurrency_mode,
            config.in_flight_per_server, store.uri(durability.keys.journal),
        )
        started_at = time.time()  # wall clock: the monitor's average over generation time
        # A sampling variant with the other thinking value is counted as it renders.
        outcome = run_shard(shard_id, prompts, server_urls, journal, config, counter)
    log.info("%s", outcome.summary())
    return {
        "shard_id": shard_id, "already_done": False, "counts": outcome.counts,
        "truncated": outcome.truncated, "resumed": outcome.resumed,
        "elapsed_s": round(outcome.elapsed_s, 3), "output_tokens": outcome.output_tokens,
        "started_at": round(started_at, 3), "finished_at": round(time.time(), 3),
        "requests": outcome.requests, "retries": outcome.retries,
        "retried_failures": outcome.retried_failures, "servers": outcome.servers,
        **({"conversations": outcome.conversations} if outcome.conversations else {}),
        **durability.stamp,
    }


def _already_done(shard_id: str, manifest: dict[str, Any] | None) -> dict[str, Any]:
    assert manifest is not None
    return {"shard_id": shard_id, "already_done": True, "counts": manifest["counts"]}


def wait_for_slot(shard_id: str, slot_free: Callable[[], bool], *, poll_s: float = 0.5,
                  timeout_s: float = 3600.0, say_every_s: float = 60.0) -> None:
    """Block until ``slot_free()`` says one of the run's generation slots is free.

    Set up and waiting, a shard queued ahead takes a freed slot within ``poll_s``. After
    ``timeout_s`` it starts anyway: Airflow still caps the shards running at once. A
    ``slot_free`` with ``holders()`` (``include.pipeline.airflow_state.SlotCheck``) says in
    the log how many slots there are and which shards hold them, when the wait starts and
    every ``say_every_s`` while it lasts.
    """
    began = time.monotonic()
    if slot_free():
        return
    holders = getattr(slot_free, "holders", None)

    def who() -> str:
        return f" ({holders()})" if holders else ""

    log.info("%s: set up and queued ahead; waiting for a generation slot%s", shard_id, who())
    said = began
    while not slot_free():
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            log.info("%s: still waiting for a generation slot after %.0fs%s", shard_id,
                     said - began, who())
        if time.monotonic() - began >= timeout_s:
            log.warning("%s: no generation slot freed in %.0fs; starting anyway", shard_id,
                        timeout_s)
            return
        time.sleep(poll_s)
    log.info("%s: a generation slot freed after %.1fs; starting", shard_id,
             time.monotonic() - began)


def wait_for_progress(
    store: Store,
    prompts_store: Store,
    shard_id: str,
    leader: str,
    fraction: float,
    *,
    start_grace_s: float = 15.0,
    stall_s: float = 60.0,
    timeout_s: float = 900.0,
    poll_s: float = 2.0,
) -> None:
    """Block until shard ``leader`` has finished ``fraction`` of its prompts, then return.

    Never a deadlock: it returns at once when the leader is done, after ``start_grace_s``
    when the leader has not started (an executor with fewer slots, or ``airflow dags test``
    running tasks one at a time), when the leader makes no progress for ``stall_s``, and
    after ``timeout_s`` in any case.
    """
    shards = json.loads(prompts_store.read(MANIFEST_KEY))["shards"]
    need = fraction * shards[shard_index(leader)]["count"]
    leading = ShardDurability(store, leader)
    began = time.monotonic()
    last_done, last_change = -1, began
    log.info("%s: staggered start, waiting for %s to finish %.0f%% of its prompts",
             shard_id, leader, 100 * fraction)
    while True:
        now = time.monotonic()
        progress = leading.progress()
        if progress.published:
            return
        if not progress.started:
            if now - began >= start_grace_s:
                log.info("%s: %s has not started; starting now", shard_id, leader)
                return
        else:
            done = progress.finished
            if done >= need:
                log.info("%s: %s has finished %d prompts; starting", shard_id, leader, done)
                return
            if done != last_done:
                last_done, last_change = done, now
            elif now - last_change >= stall_s:
                log.warning("%s: %s made no progress for %.0fs; starting anyway", shard_id,
                            leader, stall_s)
                return
        if now - began >= timeout_s:
            log.warning("%s: %s did not reach %.0f%% in %.0fs; starting anyway", shard_id,
                        leader, 100 * fraction, timeout_s)
            return
        time.sleep(poll_s)


def _cut_short(rec: dict[str, Any]) -> bool:
    """Say whether the server ended an answer by length before the tokens it was asked for.

    The budget keeps every request inside SGLang's own cap (``include/sglang/length.py``), so
    this counts a server whose context is not what it reported: shown, never silent.
    """
    asked = (rec.get("sampling") or {}).get("max_tokens")
    got = (rec.get("usage") or {}).get("completion_tokens")
    return (rec.get("finish_reason") == "length" and isinstance(asked, int)
            and isinstance(got, int) and got < asked)


def build_shard_output(
    shard_id: str, prompts: list[dict[str, Any]], records: dict[str, dict[str, Any]]
) -> tuple[bytes, dict[str, Any]]:
    """Return the shard's completions JSONL (prompt order) and its manifest.

    Raises GenerationError unless every prompt has exactly one final record.
    """
    ids = [p["id"] for p in prompts]
    check_accounting(ids, records)
    lines = []
    counts = {PromptStatus.COMPLETED: 0, PromptStatus.SKIPPED: 0, PromptStatus.FAILED: 0}
    skipped, failed = [], []
    truncated = cut_short = 0
    for prompt in prompts:
        pid = prompt["id"]
        rec = records[pid]
        counts[rec["status"]] += 1
        if rec["status"] == PromptStatus.COMPLETED:
            truncated += rec.get("finish_reason") == "length"
            cut_short += _cut_short(rec)
            full = {**rec, "messages": prompt["messages"], "metadata": prompt.get("metadata", {}),
                    "source": prompt.get("source", rec.get("source"))}
            lines.append(escape_breaks(json.dumps(full, ensure_ascii=False, sort_keys=True))
                         + "\n")
        else:
            entry = {"id": pid, "reason": rec.get("reason"), "detail": rec.get("detail", "")}
            (skipped if rec["status"] == PromptStatus.SKIPPED else failed).append(entry)
    data = "".join(lines).encode("utf-8")
    manifest = {
        "shard_id": shard_id,
        "prompts": len(ids),
        "counts": counts,
        "truncated": truncated,
        "cut_short": cut_short,
        "skipped": skipped,
        "failed": failed,
        "sha256": sha256_hex(data),
        "bytes": len(data),
        "servers": sorted({r["server"] for r in records.values() if r.get("server")}),
    }
    return data, manifest


def publish_shard(
    shard_id: str,
    store: Store,
    prompts_store: Store | None = None,
    generation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a shard's completions file from its journal and publish it create-only.

    Checks the accounting first (every prompt exactly once), writes
    ``generated/<shard>.jsonl`` then its manifest (the commit marker), verifies checksums,
    and returns the manifest. ``generation`` (the generate summary: time, servers,
    ejections) is kept in the manifest; its ``"lease"`` token fences a holder taken over
    since (``ShardDurability.publish``). A published shard is returned as it is.
    """

    def build(finals: dict[str, dict[str, Any]]) -> tuple[bytes, dict[str, Any], bytes]:
        prompts = read_shard_by_id(prompts_store or store, shard_id)
        data, manifest = build_shard_output(shard_id, prompts, finals)
        if generation and not generation.get("already_done"):
            manifest["generation"] = {k: generation[k] for k in
                                      ("elapsed_s", "started_at", "finished_at", "resumed",
                                       "output_tokens", "requests",
                                       "retries", "servers", "settings_fingerprint",
                                       "regeneration", "conversations")
                                      if k in generation}
        return data, manifest, encode_facts(finals.values())

    return ShardDurability(store, shard_id).publish((generation or {}).get("lease"), build)
