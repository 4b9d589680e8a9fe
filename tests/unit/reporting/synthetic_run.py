"""Write a small run's files with the stages' own builders, with chosen outcomes per prompt.

Prompt ids follow the real layout (``<source>:default:<n>``); generated files come from
``build_shard_output`` + ``publish_generated_shard``, tokenized ones from ``TokenizeResult``
(its manifest and parquet), journals from ``StoreJournal``: the same bytes shapes a run writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from include.durability.journal import StoreJournal
from include.generation.shard import build_shard_output
from include.layout import MANIFEST_KEY, pretokenized_key, shard_index, tokenized_keys
from include.reporting.facts import encode_facts
from include.storage import Store, publish_files, publish_generated_shard
from include.tokenization.outputs import Sample, TokenizeResult

T0 = 1_800_000_000.0


@dataclass
class ShardSpec:
    """Outcomes of one synthetic shard: how many prompts end which way."""

    completed: int = 10
    truncated: int = 0
    skipped: int = 0
    failed: int = 0
    quarantined: int = 0
    sources: tuple[str, ...] = ("alpha", "beta")
    retried: int = 0
    journal_only: bool = False  # a shard still generating: journal, no manifests
    #: Fields added to every completed journal record (e.g. ``server_version``).
    extra: dict[str, Any] = field(default_factory=dict)
    #: The reasons of the first quarantined records, in order (the rest: decode_mismatch).
    quarantine_reasons: tuple[str, ...] = ()
    #: Published as before issue 28: no report facts, no ``lengths`` in the tokenized
    #: manifest (the report reads the journal and the parquet's columns instead).
    before_facts: bool = False
    #: The tokenized manifest's ``conversations`` section (``ShardConversations.manifest()``).
    conversations: dict[str, Any] = field(default_factory=dict)
    #: Whether the shard has its trainer export (False: tokenized before the exports).
    export: bool = True


def write_prompts_manifest(store: Store, shards: dict[str, ShardSpec]) -> dict[str, Any]:
    """Write ``prompts/manifest.json`` for the shards' prompts; return it."""
    kept: dict[str, int] = {}
    for spec in shards.values():
        n = spec.completed + spec.skipped + spec.failed
        for i in range(n):
            src = spec.sources[i % len(spec.sources)]
            kept[src] = kept.get(src, 0) + 1
    sources = {s: {"name": s, "kind": "x", "read": k + 2, "kept": k,
                   "dropped": {"empty": 2}} for s, k in sorted(kept.items())}
    manifest = {
        "stage": "prepare", "sources": sources,
        "totals": {"read": sum(s["read"] for s in sources.values()), "kept": sum(kept.values()),
                   "dropped": 2 * len(sources)},
        "shards": [{"shard_id": sid, "key": f"prompts/{sid}.jsonl",
                    "count": s.completed + s.skipped + s.failed} for sid, s in shards.items()],
    }
    store.write_new(MANIFEST_KEY, json.dumps(manifest).encode())
    return manifest


def write_shard(store: Store, sid: str, spec: ShardSpec, t0: float = T0) -> None:
    """Write one shard's journal, generated files and (unless journal-only) tokenized files."""
    n = spec.completed + spec.skipped + spec.failed
    prompts, records = [], {}
    for i in range(n):
        src = spec.sources[i % len(spec.sources)]
        pid = f"{src}:default:{sid}-{i}"
        prompts.append({"id": pid, "source": src, "messages": []})
        if i < spec.completed:
            records[pid] = {
                "id": pid, "source": src, "status": "completed", "messages": [],
                "finish_reason": "length" if i < spec.truncated else "stop",
                "usage": {"prompt_tokens": 10 + i, "completion_tokens": 100 + i},
                "model": "m", "server": f"http://s{i % 2}:1",
                "timings": {"latency_s": 2.0, "attempts": 2 if i < spec.retried else 1,
                            "finished_at": t0 + 1 + i},
                **spec.extra,
            }
        elif i < spec.completed + spec.skipped:
            records[pid] = {"id": pid, "status": "skipped", "reason": "prompt_too_long",
                            "detail": "P=9"}
        else:
            records[pid] = {"id": pid, "status": "failed", "reason": "http_500",
                            "detail": "boom", "server": "http://s0:1", "attempts": 4}
    journal = StoreJournal(store, f"journal/{sid}")
    for rec in records.values():
        journal.append(rec)
    journal.close()
    if spec.journal_only:
        return
    data, manifest = build_shard_output(sid, prompts, records)
    publish_generated_shard(store, shard_index(sid), data, manifest,
                            None if spec.before_facts else encode_facts(records.values()))
    result = TokenizeResult(input_records=spec.completed, conversations=spec.conversations)
    completed = [r for r in records.values() if r["status"] == "completed"]
    for j, rec in enumerate(completed):
        if j < spec.quarantined:
            reason = (spec.quarantine_reasons[j] if j < len(spec.quarantine_reasons)
                      else "decode_mismatch")
            result.quarantined.append({"id": rec["id"], "reason": reason, "detail": ""})
        else:
            length = 110 + j
            result.samples.append(Sample(rec["id"], rec["source"], rec["finish_reason"],
                                         list(range(length)), [0] * 10 + [1] * (length - 10),
                                         []))
    result.origin = {"run_name": "synthetic", "shard": sid}
    parquet_key, conv_key, manifest_key = tokenized_keys(shard_index(sid))
    files = {parquet_key: result.to_parquet(), conv_key: result.conversations_jsonl()}
    if spec.export:
        files[pretokenized_key(shard_index(sid))] = result.pretokenized_jsonl()
    tokenized = {"shard": shard_index(sid), **result.manifest()}
    if spec.before_facts:
        del tokenized["lengths"]
    publish_files(store, files, manifest_key, tokenized)


def write_run(store: Store, shards: dict[str, ShardSpec]) -> None:
    """Write a whole synthetic run: prompt manifest and every shard."""
    write_prompts_manifest(store, shards)
    for k, (sid, spec) in enumerate(shards.items()):
        write_shard(store, sid, spec, T0 + 100 * k)
