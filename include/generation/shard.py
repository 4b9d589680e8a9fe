"""Run one prompt shard of a run through the engine, and build the shard's output files.

The generate and upload tasks' stage (``include.pipeline.generate`` / ``upload`` call it):
the lease, the waits for a slot and for the leader's progress, the engine, and publishing the
journal as the shard's completions. Keys come from ``include.layout``; whatever Airflow is
asked comes in as a callable (``is_live``, ``slot_free``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from include.durability.claims import wait_for_turn
from include.durability.journal import (
    StoreJournal,
    compact,
    merge_lines,
    prompt_records,
    read_segments,
)
from include.durability.journal_settings import (
    check_shard_journal,
    record_shard_settings,
    regeneration_reason,
)
from include.durability.lease import LEASE_TTL_S, Lease, check_token
from include.engine.config import EngineConfig
from include.engine.dispatch import run_shard
from include.engine.outcome import PromptStatus, check_accounting
from include.engine.startup import PromptCounter
from include.jsonl import escape_breaks
from include.layout import MANIFEST_KEY, journal_prefix, output_keys, shard_index, started_key
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
    lease_ttl_s: float = LEASE_TTL_S,
    **engine_overrides: Any,
) -> dict[str, Any]:
    """Generate a shard's completions into its journal; return a summary for XCom and logs.

    ``store`` is where outputs go (default: the run's location), ``prompts_store`` where the
    prompt shards are (default: ``store``). A shard whose output manifest exists is done and
    is not run again. Otherwise the engine resumes from the journal in ``store``, so a retry
    on any worker picks up where the last try stopped. ``wait_for`` (``{"shard_id",
    "fraction"}``, see ``include.pipeline.prepare_prompts.stagger``) delays the start until
    that shard has finished that share of its prompts. With ``run_id`` (every Airflow try), the try
    first takes the shard's lease (``include.durability.claims``; ``is_live`` says whether
    another run may still publish, ``lease_ttl_s`` is how soon a dead try's lease expires),
    renews it while it generates, stops with LeaseLost if it loses it, and returns the lease
    generation as ``summary["lease"]``, the fencing token ``publish_shard`` checks. With
    ``slot_free`` (whether one of the run's generation slots is free, asked of Airflow by the
    pipeline) the shard is queued ahead: it sets up first (tokenizer, prompts) and then waits
    for a slot, so it sends its first request as soon as a slot frees instead of after its
    task's start-up.
    """
    store = store or open_store(settings.run_uri)
    prompts_store = prompts_store or store
    # Before anything else, a shard done or half done under other settings is refused.
    check_shard_journal(settings, store, shard_id)
    _, manifest_key = output_keys(shard_id)
    if store.exists(manifest_key):
        manifest = json.loads(store.read(manifest_key))
        log.info("%s: already generated (%s); nothing to do", shard_id, store.uri(manifest_key))
        return {"shard_id": shard_id, "already_done": True, "counts": manifest["counts"]}
    if run_id is None:  # a manual run (the CLI, tests): no lease, as the operator chose
        return _generate(settings, shard_id, server_urls, store, prompts_store, wait_for,
                         slot_free, None, engine_overrides)
    lease = wait_for_turn(store, shard_id, journal_prefix(shard_id), run_id, is_live,
                          done=lambda: store.exists(manifest_key),
                          poll_s=min(5.0, lease_ttl_s / 4), ttl_s=lease_ttl_s)
    if lease is None:
        manifest = json.loads(store.read(manifest_key))
        return {"shard_id": shard_id, "already_done": True, "counts": manifest["counts"]}
    complete = False
    try:
        summary = _generate(settings, shard_id, server_urls, store, prompts_store, wait_for,
                            slot_free, lease, engine_overrides)
        lease.confirm()  # checked before the summary vouches for the journal
        complete = True
        return {**summary, "lease": lease.token}
    finally:
        lease.release(complete)


def _generate(settings: RunSettings, shard_id: str, server_urls: list[str], store: Store,
              prompts_store: Store, wait_for: dict[str, Any] | None,
              slot_free: Callable[[], bool] | None, lease: Lease | None,
              engine_overrides: dict[str, Any]) -> dict[str, Any]:
    # Loaded on a thread while the prompts are read and the servers asked; the first
    # requests need not wait for it (``startup``).
    counter = PromptCounter(settings.tokenizer_path or settings.model_path,
                            settings.enable_thinking)
    prompts = read_shard_by_id(prompts_store, shard_id)
    config = EngineConfig.from_settings(settings, **engine_overrides)
    if slot_free is not None:
        wait_for_slot(shard_id, slot_free)
    if lease is not None:
        lease.check()  # the waits above can be long: no start marker from a lost holder
    extra = {}
    if settings.force_regenerate and prompts_store.root != store.root:
        # The run's own location holds the journal this regeneration replaces.
        extra["regeneration"] = {
            "reason": regeneration_reason(settings, prompts_store, shard_id),
            "earlier_journal": prompts_store.uri(journal_prefix(shard_id))}
    record = record_shard_settings(settings, store, shard_id, **extra)
    store.write_new(started_key(shard_id), b"")
    if wait_for:
        wait_for_progress(store, prompts_store, shard_id, wait_for["shard_id"],
                          wait_for["fraction"])
    log.info(
        "%s: %d prompts -> %d servers %s | model %s, context_length %d, max_tokens cap %d, "
        "concurrency %s (start %d per server) | journal %s",
        shard_id, len(prompts), len(server_urls), server_urls, config.model,
        config.context_length, config.max_tokens, config.concurrency_mode,
        config.in_flight_per_server, store.uri(journal_prefix(shard_id)),
    )
    journal = StoreJournal(store, journal_prefix(shard_id),
                           fence=lease.check if lease else None,
                           tag=f"{lease.generation:08d}" if lease else "")
    started_at = time.time()  # wall clock: the monitor's average over generation time
    try:
        # A sampling variant with the other thinking value is counted as it renders.
        outcome = run_shard(shard_id, prompts, server_urls, journal, config, counter)
    finally:
        journal.close()
    log.info("%s", outcome.summary())
    recorded = {"settings_fingerprint": record["fingerprint"],
                **({"regeneration": record["regeneration"]} if "regeneration" in record else {})}
    return {
        **recorded, "shard_id": shard_id, "already_done": False, "counts": outcome.counts,
        "truncated": outcome.truncated, "resumed": outcome.resumed,
        "elapsed_s": round(outcome.elapsed_s, 3), "output_tokens": outcome.output_tokens,
        "started_at": round(started_at, 3), "finished_at": round(time.time(), 3),
        "requests": outcome.requests, "retries": outcome.retries,
        "retried_failures": outcome.retried_failures, "servers": outcome.servers,
        **({"conversations": outcome.conversations} if outcome.conversations else {}),
    }


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
    began = time.monotonic()
    last_done, last_change = -1, began
    read_segments: set[str] = set()
    finished: dict[str, dict[str, Any]] = {}
    log.info("%s: staggered start, waiting for %s to finish %.0f%% of its prompts",
             shard_id, leader, 100 * fraction)
    while True:
        now = time.monotonic()
        if store.exists(output_keys(leader)[1]):
            return
        if not store.exists(started_key(leader)):
            if now - began >= start_grace_s:
                log.info("%s: %s has not started; starting now", shard_id, leader)
                return
        else:
            # Segments never change once written: read each new one once.
            for key in store.list(journal_prefix(leader)):
                if key.endswith(".jsonl") and key not in read_segments:
                    read_segments.add(key)
                    merge_lines(store.read(key).splitlines(), finished)
            done = len(finished)
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
    ejections) is kept in the manifest. A shard whose manifest exists is already published
    and is returned as it is, so a retry never rewrites it. A summary with a lease token
    (``generation["lease"]``) is fenced: LeaseLost, nothing written, when a newer lease
    generation was taken since (this summary's holder was taken over: a late write); the
    token is recorded in the manifest as ``"lease"``.
    """
    from include.storage.publish import publish_generated_shard

    _, manifest_key = output_keys(shard_id)
    if store.exists(manifest_key):
        log.info("%s: already published at %s", shard_id, store.uri(manifest_key))
        compact_journal(store, shard_id)  # a retry after a compaction that failed
        return json.loads(store.read(manifest_key))
    token = (generation or {}).get("lease")
    if token:
        check_token(store, journal_prefix(shard_id), token["generation"], shard_id)
    prompts = read_shard_by_id(prompts_store or store, shard_id)
    segments = read_segments(store, journal_prefix(shard_id))
    records: dict[str, dict[str, Any]] = {}
    for _, lines in segments:
        merge_lines(lines.splitlines(), records)
    finals = prompt_records(records)
    data, manifest = build_shard_output(shard_id, prompts, finals)
    if generation and not generation.get("already_done"):
        manifest["generation"] = {k: generation[k] for k in
                                  ("elapsed_s", "started_at", "finished_at", "resumed",
                                   "output_tokens", "requests",
                                   "retries", "servers", "settings_fingerprint",
                                   "regeneration", "conversations")
                                  if k in generation}
    if token:
        # Again after the journal read, which can take a while. Past this point a newer
        # holder appears only if this run ended or its generate task was cleared (see
        # claims), and the manifest is create-only: one version is ever published.
        check_token(store, journal_prefix(shard_id), token["generation"], shard_id)
        manifest["lease"] = {"generation": token["generation"], "holder": token["holder"]}
    result = publish_generated_shard(store, shard_index(shard_id), data, manifest,
                                     encode_facts(finals.values()))
    log.info("%s: published %d completions (%d skipped, %d failed) to %s", shard_id,
             manifest["counts"][PromptStatus.COMPLETED], manifest["counts"][PromptStatus.SKIPPED],
             manifest["counts"][PromptStatus.FAILED], store.uri(output_keys(shard_id)[0]))
    compact_journal(store, shard_id, segments)
    return result.manifest


def compact_journal(store: Store, shard_id: str,
                    segments: list[tuple[str, bytes]] | None = None) -> None:
    """Compact a published shard's journal (``journal.compact``); a failure only logs: the
    shard is published either way, and the segments still hold the journal."""
    try:
        compact(store, journal_prefix(shard_id), segments)
    except Exception as exc:  # noqa: BLE001 - an optimisation for readers, never a failure
        log.warning("%s: compacting the journal failed (%s); readers use its segments",
                    shard_id, exc)
