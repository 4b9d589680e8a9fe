"""Live state of runs for the monitor page, read from the runs' own files only.

A run is a folder ``<output root>/<run_name>/`` holding ``prompts/manifest.json``; its outputs
live in the run folder itself and in each ``regenerations/<id>/`` under it (forced
regenerations). Per outputs location: a shard is *done* when its tokenized manifest exists,
*running* when it has journal segments or a generated manifest but no tokenized manifest, and
*left* otherwise. Row counts come from the generated manifest of a shard that has one and from
the journal of a shard still generating (the manifest is built from that journal: one source
per shard). Journal segments are immutable, so their parsed summaries are cached by key.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from include.generation.journal import merge_lines
from include.storage import LocalStore, Store

#: Seconds of recent completions the tokens/s and ETA are computed over.
RATE_WINDOW_S = 120.0


@dataclass
class _Part:
    """The slim content of one journal segment: final status per id, and completions."""

    status: dict[str, str] = field(default_factory=dict)
    finished: list[tuple[str, float, int, str]] = field(default_factory=list)


class RunMonitor:
    """Read run states under one output root; keeps a cache of parsed journal segments."""

    def __init__(self, store: Store, probe_timeout_s: float = 1.0) -> None:
        self.store = store
        self.probe_timeout_s = probe_timeout_s
        self._parts: dict[str, _Part] = {}
        self._json: dict[str, dict[str, Any]] = {}

    # --- discovery -------------------------------------------------------------------------
    def run_names(self) -> list[str]:
        """Return the run folders under the root (those holding ``prompts/manifest.json``)."""
        inner = getattr(self.store, "inner", self.store)
        if isinstance(inner, LocalStore):
            # One directory listing instead of walking every journal file of every run.
            root = Path(inner.root)
            names = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
            return sorted(n for n in names if self.store.exists(f"{n}/prompts/manifest.json"))
        return sorted({k.split("/")[0] for k in self.store.list("")
                       if k.endswith("/prompts/manifest.json") and k.count("/") == 2})

    def _read_json(self, key: str, cache: bool) -> dict[str, Any]:
        if cache and key in self._json:
            return self._json[key]
        data = json.loads(self.store.read(key))
        if cache:
            self._json[key] = data
        return data

    def _part(self, key: str) -> _Part:
        part = self._parts.get(key)
        if part is None:
            part = _Part()
            records: dict[str, dict[str, Any]] = {}
            merge_lines(self.store.read(key).splitlines(), records)
            for rec in records.values():
                part.status[rec["id"]] = rec.get("status", "")
                if rec.get("status") == "completed":
                    finished_at = float((rec.get("timings") or {}).get("finished_at") or 0)
                    tokens = int((rec.get("usage") or {}).get("completion_tokens") or 0)
                    part.finished.append((rec["id"], finished_at, tokens, rec.get("server", "")))
            self._parts[key] = part
        return part

    # --- state -----------------------------------------------------------------------------
    def runs(self, now: float | None = None, probe: bool = True) -> list[dict[str, Any]]:
        """Return the state of every run under the root (see ``run_state``)."""
        return [self.run_state(name, now=now, probe=probe) for name in self.run_names()]

    def run_state(self, name: str, now: float | None = None, probe: bool = True
                  ) -> dict[str, Any]:
        """Return one run's state: one entry per outputs location, newest report links."""
        now = time.time() if now is None else now
        # The prompt manifest is rewritten by nobody (create-only), so it is cached.
        manifest = self._read_json(f"{name}/prompts/manifest.json", cache=True)
        shard_prompts = {s["shard_id"]: s["count"] for s in manifest["shards"] if s["count"]}
        keys = self.store.list(f"{name}/")
        locations = sorted({k[len(name) + 1:].split("/report/")[0].split("/journal/")[0]
                            .split("/generated/")[0].split("/tokenized/")[0]
                            for k in keys if k.startswith(f"{name}/regenerations/")})
        locations = [""] + [loc for loc in locations if loc.count("/") == 1]
        out = []
        for loc in locations:
            base = f"{name}/{loc}/" if loc else f"{name}/"
            mine = [k[len(base):] for k in keys if k.startswith(base)
                    and (loc or not k.startswith(f"{name}/regenerations/"))]
            out.append(self._location_state(base, loc, mine, shard_prompts, now, probe))
        return {"run_name": name, "prompts": sum(shard_prompts.values()),
                "shards_in_run": len(shard_prompts), "locations": out}

    def _location_state(self, base: str, loc: str, keys: list[str],
                        shard_prompts: dict[str, int], now: float, probe: bool
                        ) -> dict[str, Any]:
        tokenized = {k.split("/")[1].split(".")[0] for k in keys
                     if k.startswith("tokenized/") and k.endswith(".manifest.json")}
        generated = {k.split("/")[1].split(".")[0] for k in keys
                     if k.startswith("generated/") and k.endswith(".manifest.json")}
        journals: dict[str, list[str]] = {}
        for k in keys:
            if k.startswith("journal/") and k.endswith(".jsonl"):
                journals.setdefault(k.split("/")[1], []).append(k)
        running = sorted((generated | set(journals)) - tokenized)
        counts = {"completed": 0, "skipped": 0, "failed": 0}
        recent: list[tuple[float, int, str]] = []
        servers_seen: dict[str, float] = {}
        finished_running = 0
        for sid in sorted(generated):
            m = self._read_json(f"{base}generated/{sid}.manifest.json", cache=True)
            for k in counts:
                counts[k] += m["counts"][k]
        for sid in sorted(set(journals) - generated):
            status: dict[str, str] = {}
            for key in sorted(journals[sid]):
                part = self._part(base + key)
                for pid, st in part.status.items():
                    status.setdefault(pid, st)
                for _, finished_at, tokens, server in part.finished:
                    recent.append((finished_at, tokens, server))
                    servers_seen[server] = max(servers_seen.get(server, 0.0), finished_at)
            for st in status.values():
                if st in counts:
                    counts[st] += 1
            finished_running += len(status)
        window = [r for r in recent if 0 <= now - r[0] <= RATE_WINDOW_S]
        tokens_per_s = sum(t for _, t, _ in window) / RATE_WINDOW_S
        prompts_per_s = len(window) / RATE_WINDOW_S
        if loc:
            left_shards = None
            remaining = sum(shard_prompts.get(s, 0) for s in running) - finished_running
        else:
            left = [s for s in shard_prompts if s not in tokenized and s not in running]
            left_shards = len(left)
            remaining = (sum(shard_prompts[s] for s in left)
                         + sum(shard_prompts.get(s, 0) for s in running if s not in generated)
                         - finished_running)
        eta_s = remaining / prompts_per_s if prompts_per_s > 0 and remaining > 0 else None
        reports = sorted({k.split("/")[1] for k in keys
                          if k.startswith("report/") and k.endswith("/report.json")})
        report_links = []
        for rid in reports:
            rep = self._read_json(f"{base}report/{rid}/report.json", cache=True)
            report_links.append({"airflow_run_id": rid, "passed": rep.get("passed"),
                                 "key": f"{base}report/{rid}/report.html"})
        return {
            "location": loc or ".", "shards_done": len(tokenized), "shards_running": len(running),
            "running": running, "shards_left": left_shards,
            "rows": counts, "remaining_prompts": max(remaining, 0),
            "tokens_per_s": round(tokens_per_s, 1), "eta_s": None if eta_s is None
            else round(eta_s), "servers": self._servers(servers_seen, now, probe and running),
            "reports": report_links,
        }

    def _servers(self, seen: dict[str, float], now: float, probe: bool) -> list[dict[str, Any]]:
        urls = sorted(u for u in seen if u)
        health: dict[str, str] = {}
        if probe and urls:
            with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
                health = dict(zip(urls, pool.map(self._probe, urls), strict=True))
        return [{"url": u, "last_completion_s_ago": round(now - seen[u], 1),
                 "health": health.get(u, "not probed (no shard running)")} for u in urls]

    def _probe(self, url: str) -> str:
        try:
            with urllib.request.urlopen(url + "/health", timeout=self.probe_timeout_s) as r:
                return "healthy" if r.status == 200 else f"HTTP {r.status}"
        except Exception as exc:  # any failure means "not healthy"; say which
            return f"down ({type(exc).__name__})"
