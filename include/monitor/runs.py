"""Live state of runs for the monitor page, read from the runs' own files only.

A run is a folder ``<output root>/<run_name>/`` holding ``prompts/manifest.json``; its outputs
live in the run folder itself and in each ``regenerations/<id>/`` under it (forced
regenerations). Per outputs location, by its files (what a task's Airflow state does not
say; the words shown are ``include.monitor.states.FILE_WORDS``): a shard is *tokenized* when its
tokenized manifest exists, *generated* when only its generated manifest exists, has its
*journal being written* when it has a journal (its ``started`` marker or segments) and no
manifest, and *no journal yet* otherwise. Prompt outcomes (completed, of them truncated,
skipped, failed) come from the generated manifest of a shard that has one and from the
journal of a shard still generating (the manifest is built from that journal: one source per
shard); rows written, quarantined and dropped from the tokenized manifests.

Tokens/s: while shards generate, over the journals' last ``RATE_WINDOW_S`` seconds; once none
does, the report's figure (``include.reporting.throughput.generation_average``).

A page open in several browsers must not turn into a listing of the store and a probe of every
server per request: ``live_runs`` answers from states at most ``ttl_s`` old (one listing per
run, one probe per server per ``ttl_s``), and every cache is bounded. Journal segments and
manifests are create-only, so what is parsed from them is kept (least recently used first out).

Only the deployment's own servers are probed (``own_servers``:
``include.servers.launch_report.server_addresses``), at the URL rebuilt from host and port: a
URL a journal names (``file://...``, another host) is shown, never requested.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache, TTLCache

from include.durability.journal import is_final, merge_lines
from include.layout import (
    CARD_NAME,
    GENERATED_PREFIX,
    JOURNAL_PREFIX,
    MANIFEST_KEY,
    REGENERATIONS_PREFIX,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_PREFIX,
    SHARD_MANIFEST_SUFFIX,
    TOKENIZED_PREFIX,
)
from include.monitor.states import FILE_WORDS, FileFact
from include.outcomes import PromptStatus

# The one definition of tokens/s, the report's (issue 34): re-exported for the page's callers.
from include.reporting.throughput import generation_average, generation_span
from include.servers.launch_report import own_server_url
from include.sglang import sync as sglang_sync
from include.sglang.contract import HEALTH_PROBE_TIMEOUT_FLOOR_S, health_probe_timeout_s
from include.storage import Store

#: What a server a journal names shows when it is not one of the deployment's (not probed).
NOT_OURS = FILE_WORDS[FileFact.NOT_OURS]
#: Seconds of recent completions the tokens/s and ETA are computed over.
RATE_WINDOW_S = 120.0
#: What a run's report folder holds (see include/reporting/build.py), by extension, with its
#: media type: nothing else is served.
#: Markdown (the dataset card, report.md) as text: a browser shows it instead of downloading it.
REPORT_MEDIA_TYPES = {"html": "text/html", "md": "text/plain; charset=utf-8",
                      "json": "application/json",
                      "png": "image/png"}
# One path segment written by this project: no "", ".", ".." or hidden names.
_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
_REPORT_KEY = re.compile(
    rf"{_SEGMENT}/(?:{REGENERATIONS_PREFIX}/{_SEGMENT}/)?{REPORT_PREFIX}/{_SEGMENT}/{_SEGMENT}"
    r"\.(?P<ext>[a-z]+)")


def is_report_file(key: str) -> bool:
    """Return whether ``key`` is exactly ``<run>/[regenerations/<id>/]report/<run id>/<file>``
    of a ``REPORT_MEDIA_TYPES`` kind (not a journal of a regeneration whose id is ``report``)."""
    match = _REPORT_KEY.fullmatch(key)
    return match is not None and match["ext"] in REPORT_MEDIA_TYPES


@dataclass(frozen=True)
class Rate:
    """Throughput over the journals' last ``RATE_WINDOW_S`` seconds, as of their last line."""

    tokens_per_s: float
    prompts_per_s: float
    as_of: float


def journal_rate(finished: list[tuple[float, int]], window_s: float = RATE_WINDOW_S
                 ) -> Rate | None:
    """Return the rate of completions ``(finished_at, completion tokens)``, or None.

    Measured on the journals' own clock, not the page's: over the ``window_s`` seconds before
    the last completion when the journals go back further; otherwise from the first
    completion to the last, without the first one's tokens (they were generated before the
    span starts). None until two completions are apart in time.
    """
    if not finished:
        return None
    times = sorted(finished)
    end = times[-1][0]
    start = end - window_s
    if times[0][0] < start:
        span, counted = window_s, [t for t in times if t[0] > start]
    else:
        span, counted = end - times[0][0], times[1:]
    if span <= 0:
        return None
    return Rate(sum(t for _, t in counted) / span, len(counted) / span, end)


@dataclass
class _Part:
    """The slim content of one journal segment: status per id, and completions."""

    status: dict[str, str] = field(default_factory=dict)
    #: Ids whose record here is a retryable failure (a later record replaces it).
    retryable: set[str] = field(default_factory=set)
    finished: list[tuple[float, int, str]] = field(default_factory=list)
    #: Completed ids whose answer hit max_tokens (``finish_reason`` "length").
    truncated: set[str] = field(default_factory=set)


class RunMonitor:
    """Read run states under one output root, with bounded caches (see the module doc)."""

    def __init__(self, store: Store, probe_timeout_s: float = HEALTH_PROBE_TIMEOUT_FLOOR_S,
                 ttl_s: float = 5.0, max_runs: int = 64, max_journal_records: int = 200_000,
                 timer: Callable[[], float] = time.monotonic,
                 own_servers: Iterable[tuple[str, int]] = ()) -> None:
        self.store = store
        # The (host, port) pairs that may be probed; none by default: probing is opt-in.
        self.own_servers = frozenset(own_servers)
        # SGLang's /health takes at least 1 s: a shorter probe shows every server down.
        self.probe_timeout_s = health_probe_timeout_s(probe_timeout_s)
        self._lock = threading.RLock()
        self._names: TTLCache[str, list[str]] = TTLCache(1, ttl_s, timer)
        self._states: TTLCache[str, dict[str, Any]] = TTLCache(max_runs, ttl_s, timer)
        self._health: TTLCache[str, str] = TTLCache(256, ttl_s, timer)
        # Sized in journal records, the bulk of what is kept: memory stays bounded however
        # many shards a run has.
        self._parts: LRUCache[str, _Part] = LRUCache(
            max_journal_records, getsizeof=lambda p: len(p.status) + 1)
        # Two small facts per published shard (generated, tokenized) and one per report.
        self._facts: LRUCache[str, Any] = LRUCache(16384)

    # --- discovery -------------------------------------------------------------------------
    def run_names(self) -> list[str]:
        """Return the run folders under the root (those holding ``prompts/manifest.json``)."""
        # One folder-level listing, never a listing of every file of every run.
        _, folders = self.store.list_children("")
        names = [f.rstrip("/") for f in folders]
        return sorted(n for n in names if self.store.exists(f"{n}/{MANIFEST_KEY}"))

    def _fact(self, key: str, extract: Callable[[dict[str, Any]], Any]) -> Any:
        """Return ``extract(json at key)`` of a create-only file, parsed once."""
        if key not in self._facts:
            self._facts[key] = extract(json.loads(self.store.read(key)))
        return self._facts[key]

    def _part(self, key: str) -> _Part:
        part = self._parts.get(key)
        if part is None:
            part = _Part()
            records: dict[str, dict[str, Any]] = {}
            merge_lines(self.store.read(key).splitlines(), records)
            for rec in records.values():
                if rec.get("kind") == "conversation_turn":
                    continue  # a turn, not a prompt: its conversation's final record counts
                part.status[rec["id"]] = rec.get("status", "")
                if not is_final(rec):
                    part.retryable.add(rec["id"])
                if rec.get("status") == PromptStatus.COMPLETED:
                    if rec.get("finish_reason") == "length":
                        part.truncated.add(rec["id"])
                    finished_at = float((rec.get("timings") or {}).get("finished_at") or 0)
                    tokens = int((rec.get("usage") or {}).get("completion_tokens") or 0)
                    part.finished.append((finished_at, tokens, rec.get("server", "")))
            try:
                self._parts[key] = part
            except ValueError:  # one segment larger than the whole cache: use it uncached
                pass
        return part

    # --- state -----------------------------------------------------------------------------
    def live_runs(self) -> list[dict[str, Any]]:
        """Return every run's state, each at most ``ttl_s`` old (for the page and its API)."""
        with self._lock:  # concurrent requests wait for one computation instead of repeating it
            names = self._names.get("")
            if names is None:
                names = self._names[""] = self.run_names()
            out = []
            for name in names:
                state = self._states.get(name)
                if state is None:
                    state = self._states[name] = self.run_state(name)
                out.append(state)
            return out

    def runs(self, now: float | None = None, probe: bool = True) -> list[dict[str, Any]]:
        """Return the state of every run under the root, read now (see ``run_state``)."""
        with self._lock:
            return [self.run_state(name, now=now, probe=probe) for name in self.run_names()]

    def run_state(self, name: str, now: float | None = None, probe: bool = True
                  ) -> dict[str, Any]:
        """Return one run's state: one entry per outputs location, newest report links."""
        now = time.time() if now is None else now
        shard_prompts = self._fact(f"{name}/{MANIFEST_KEY}", lambda m: {
            s["shard_id"]: s["count"] for s in m["shards"] if s["count"]})
        _, forced = self.store.list_children(f"{name}/{REGENERATIONS_PREFIX}/")
        locations = [""] + [sub[len(name) + 1:].rstrip("/") for sub in forced]
        out = []
        for loc in locations:
            base = f"{name}/{loc}/" if loc else f"{name}/"
            out.append(self._location_state(base, loc, self._listing(base), shard_prompts,
                                            now, probe))
        return {"run_name": name, "prompts": sum(shard_prompts.values()),
                "shards_in_run": len(shard_prompts), "locations": out}

    def _listing(self, base: str) -> list[str]:
        """Return the keys of one outputs location the state reads, relative to it.

        A folder at a time (``Store.list_children``): the manifests, the report files, and
        the journal segments of shards not yet published only. A finished shard's segments
        (most of a long run's keys) are never listed again.
        """
        def children(folder: str) -> tuple[list[str], list[str]]:
            keys, subs = self.store.list_children(base + folder)
            return [k[len(base):] for k in keys], [s[len(base):] for s in subs]

        out = [*children(f"{GENERATED_PREFIX}/")[0], *children(f"{TOKENIZED_PREFIX}/")[0]]
        for report in children(f"{REPORT_PREFIX}/")[1]:
            out += children(report)[0]
        published = {k.split("/")[1].split(".")[0] for k in out
                     if k.endswith(SHARD_MANIFEST_SUFFIX)}
        for journal in children(f"{JOURNAL_PREFIX}/")[1]:
            if journal.rstrip("/").rsplit("/", 1)[-1] not in published:
                out += children(journal)[0]
        return out

    def _location_state(self, base: str, loc: str, keys: list[str],
                        shard_prompts: dict[str, int], now: float, probe: bool
                        ) -> dict[str, Any]:
        tokenized = {k.split("/")[1].split(".")[0] for k in keys
                     if k.startswith(f"{TOKENIZED_PREFIX}/")
                     and k.endswith(SHARD_MANIFEST_SUFFIX)}
        generated = {k.split("/")[1].split(".")[0] for k in keys
                     if k.startswith(f"{GENERATED_PREFIX}/")
                     and k.endswith(SHARD_MANIFEST_SUFFIX)}
        journals: dict[str, list[str]] = {}  # a shard's segments; none yet right after start
        for k in keys:
            if k.startswith(f"{JOURNAL_PREFIX}/") and k.count("/") == 2:
                segments = journals.setdefault(k.split("/")[1], [])
                if k.endswith(".jsonl"):
                    segments.append(k)
        generating = sorted(set(journals) - generated - tokenized)
        counts = {PromptStatus.COMPLETED: 0, "truncated": 0, PromptStatus.SKIPPED: 0,
                  PromptStatus.FAILED: 0}
        finished: list[tuple[float, int]] = []
        spans: list[tuple[float, float, int]] = []
        servers_seen: dict[str, float] = {}
        progress: dict[str, int] = {}
        for sid in sorted(generated):
            shard_counts, span = self._fact(
                f"{base}{GENERATED_PREFIX}/{sid}{SHARD_MANIFEST_SUFFIX}", _generated_facts)
            for k in counts:
                counts[k] += shard_counts[k]
            if span:
                spans.append(span)
        for sid in generating:
            status: dict[str, str] = {}
            retryable: set[str] = set()
            truncated: set[str] = set()
            for key in sorted(journals[sid]):
                part = self._part(base + key)
                for pid, st in part.status.items():
                    # The journal's own rule: the first final record wins, and a retryable
                    # failure gives way to a later record (the prompt is generated again).
                    if pid not in status or pid in retryable:
                        status[pid] = st
                        retryable.discard(pid)
                        truncated.discard(pid)
                        if pid in part.retryable:
                            retryable.add(pid)
                        if pid in part.truncated:
                            truncated.add(pid)
                for finished_at, tokens, server in part.finished:
                    finished.append((finished_at, tokens))
                    servers_seen[server] = max(servers_seen.get(server, 0.0), finished_at)
            for st in status.values():
                if st in counts:
                    counts[st] += 1
            counts["truncated"] += len(truncated)
            progress[sid] = len(status)
        rows = {"written": 0, "quarantined": 0, "dropped": 0}
        for sid in sorted(tokenized):
            facts = self._fact(f"{base}{TOKENIZED_PREFIX}/{sid}{SHARD_MANIFEST_SUFFIX}",
                               _tokenized_facts)
            for k in rows:
                rows[k] += facts[k]
        # A forced regeneration's selection is not in the store: only its started shards count.
        left = None if loc else sorted(s for s in shard_prompts if s not in tokenized
                                       and s not in generated and s not in journals)
        remaining = (sum(shard_prompts.get(s, 0) - progress[s] for s in generating)
                     + sum(shard_prompts[s] for s in left or ()))
        rate = journal_rate(finished)
        idle_s = None if rate is None else max(now - rate.as_of, 0.0)
        eta_s = (remaining / rate.prompts_per_s if rate and remaining > 0 and idle_s is not None
                 and idle_s <= RATE_WINDOW_S else None)
        average = None if generating else generation_average(spans)
        listed = set(keys)
        reports = sorted({k.split("/")[1] for k in keys
                          if k.startswith(f"{REPORT_PREFIX}/") and k.endswith(f"/{REPORT_JSON}")})
        report_links = [
            {"airflow_run_id": rid, "key": f"{base}{REPORT_PREFIX}/{rid}/{REPORT_HTML}",
             "passed": self._fact(f"{base}{REPORT_PREFIX}/{rid}/{REPORT_JSON}",
                                  lambda r: r.get("passed")),
             # The dataset card the report wrote beside itself: what a training team acts on.
             **({"card": f"{base}{REPORT_PREFIX}/{rid}/{CARD_NAME}"}
                if f"{REPORT_PREFIX}/{rid}/{CARD_NAME}" in listed else {})}
            for rid in reports]
        tokens_per_s = (rate.tokens_per_s if rate is not None and generating
                        else average if average is not None else None)
        return {
            "location": loc or ".", "shards_done": len(tokenized),
            "shards_running": len(generating), "shards_left": None if left is None else len(left),
            "generating": [{"shard_id": s, "finished": progress[s],
                            "prompts": shard_prompts.get(s, 0)} for s in generating],
            "tokenizing": sorted(generated - tokenized), "left": left,
            "rows": counts, "tokenized_rows": rows, "remaining_prompts": max(remaining, 0),
            "tokens_per_s": None if tokens_per_s is None else round(tokens_per_s, 1),
            # "window": over the last RATE_WINDOW_S s; "average": over the generation time.
            "rate_basis": "window" if generating else "average",
            "idle_s": None if idle_s is None else round(idle_s),
            "eta_s": None if eta_s is None else round(eta_s),
            "servers": self._servers(servers_seen, now, probe and bool(generating)),
            "reports": report_links,
        }

    def _servers(self, seen: dict[str, float], now: float, probe: bool) -> list[dict[str, Any]]:
        urls = sorted(u for u in seen if u)
        # Journal URL -> the deployment's own URL for it; a URL not in the deployment: None.
        own = {u: own_server_url(u, self.own_servers) for u in urls}
        targets = sorted({o for o in own.values() if o}) if probe else []
        health = {o: self._health[o] for o in targets if o in self._health}
        stale = [o for o in targets if o not in health]
        if stale:
            with concurrent.futures.ThreadPoolExecutor(len(stale)) as pool:
                for url, result in zip(stale, pool.map(self._probe, stale), strict=True):
                    health[url] = self._health[url] = result
        return [{"url": u, "last_completion_s_ago": round(now - seen[u], 1),
                 "health": NOT_OURS if own[u] is None
                 else health.get(own[u], FILE_WORDS[FileFact.NOT_PROBED])} for u in urls]

    def _probe(self, url: str) -> str:
        # HTTP only, no redirect followed, never under the /health floor (include.sglang).
        answer = sglang_sync.health(url, self.probe_timeout_s)
        if answer.answered:
            return FILE_WORDS[FileFact.HEALTHY] if answer.status == 200 else f"HTTP {answer.status}"
        return (f"{FILE_WORDS[FileFact.DOWN]} "
                f"({type(answer.error).__name__ if answer.error else answer.failure})")


def _generated_facts(manifest: dict[str, Any]) -> tuple[dict[str, int], Any]:
    """Return a generated manifest's prompt outcomes and its generation span, if recorded
    (``(started_at, finished_at, output tokens)``; manifests before the span have none)."""
    c = manifest["counts"]
    counts = {PromptStatus.COMPLETED: c[PromptStatus.COMPLETED],
              "truncated": int(manifest.get("truncated") or 0),
              PromptStatus.SKIPPED: c[PromptStatus.SKIPPED],
              PromptStatus.FAILED: c[PromptStatus.FAILED]}
    return counts, generation_span(manifest)


def _tokenized_facts(manifest: dict[str, Any]) -> dict[str, int]:
    c = manifest.get("counts") or {}
    return {"written": int(c.get("written") or 0),
            "quarantined": sum((c.get("quarantined") or {}).values()),
            "dropped": sum((c.get("dropped") or {}).values())}
