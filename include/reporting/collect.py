"""Read what a run wrote (manifests, journals, tokenized lengths) into compact per-shard facts.

Only the files of the run are read, each for the figures it is the source of truth for (see
``SOURCES_OF_TRUTH`` in ``include.reporting.build``). Journal records are reduced to the few
fields the report needs as they are read, so a shard of long completions costs little memory.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from include.generation.shard import load_journal_records
from include.layout import output_keys, shard_index, tokenized_keys
from include.storage import Store


def source_of(prompt_id: str) -> str:
    """Return the source name of a prompt id (``<source>:<config>:<row>``, see data-layout)."""
    return prompt_id.split(":", 1)[0]


@dataclass
class Completion:
    """The report's view of one completed journal record."""

    source: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    server: str
    model: str
    finished_at: float
    latency_s: float
    attempts: int
    #: SGLang's version as the record says its server reported it ("" when it does not).
    server_version: str = ""
    #: The weights that answered (``metadata.weight_version``; "" when not reported).
    weight_version: str = ""
    #: The server's count of thinking tokens (``usage.completion_tokens_details``), or None.
    reasoning_tokens: int | None = None
    #: The prompt's id, and its mixed-sampling variant ("" when the run had one sampling).
    prompt_id: str = ""
    variant: str = ""


@dataclass
class ShardFacts:
    """Everything the report reads of one shard; ``None`` where a file is missing."""

    shard_id: str
    reused: bool
    generated: dict[str, Any] | None = None
    tokenized: dict[str, Any] | None = None
    completions: list[Completion] = field(default_factory=list)
    #: ``attempts`` of each failed journal record (retries spent on prompts that still failed).
    failed_attempts: list[int] = field(default_factory=list)
    #: ``(source, length)`` of every tokenized sample, from the parquet's columns.
    tokenized_lengths: list[tuple[str, int]] = field(default_factory=list)


def read_json(store: Store, key: str) -> dict[str, Any] | None:
    """Return the JSON object at ``key``, or None when it does not exist."""
    if not store.exists(key):
        return None
    return json.loads(store.read(key))


def _usage(rec: dict[str, Any]) -> dict[str, int]:
    """Return a record's usage; a whole conversation's is the sum of its turns' usage."""
    if rec.get("usage") or not rec.get("turn_results"):
        return rec.get("usage") or {}
    turns = [t.get("usage") or {} for t in rec["turn_results"]]
    return {k: sum(int(u.get(k) or 0) for u in turns)
            for k in ("prompt_tokens", "completion_tokens")}


def _reasoning_tokens(rec: dict[str, Any]) -> int | None:
    """Return the server's reasoning-token count of a record (its turns' sum), or None."""
    usages = ([t.get("usage") or {} for t in rec["turn_results"]] if rec.get("turn_results")
              else [rec.get("usage") or {}])
    # SGLang 0.5.23 counts them always at ``usage.reasoning_tokens`` (the OpenAI place,
    # ``completion_tokens_details``, only when there are some); older releases do not.
    counts = [u.get("reasoning_tokens", (u.get("completion_tokens_details") or {}).get(
        "reasoning_tokens")) for u in usages]
    if any(type(c) is not int for c in counts):
        return None
    return sum(counts)


def _completion(rec: dict[str, Any]) -> Completion:
    usage = _usage(rec)
    timings = rec.get("timings") or {}
    last_turn = (rec.get("turn_results") or [{}])[-1]
    return Completion(
        source=rec.get("source") or source_of(rec["id"]),
        finish_reason=str(rec.get("finish_reason")),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        server=str(rec.get("server") or last_turn.get("server") or ""),
        model=str(rec.get("model") or ""),
        finished_at=float(timings.get("finished_at") or 0.0),
        latency_s=float(timings.get("latency_s") or 0.0),
        attempts=int(timings.get("attempts") or 1),
        server_version=str(rec.get("server_version") or last_turn.get("server_version") or ""),
        weight_version=str(rec.get("weight_version") or last_turn.get("weight_version") or ""),
        reasoning_tokens=_reasoning_tokens(rec),
        prompt_id=str(rec["id"]),
        variant=str((rec.get("sampling") or {}).get("variant") or ""),
    )


def _parquet_lengths(store: Store, key: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    # Two scalar columns only: the token lists are what makes these files large.
    table = pq.read_table(io.BytesIO(store.read(key)), columns=["source", "length"])
    return list(zip(table.column("source").to_pylist(), table.column("length").to_pylist(),
                    strict=True))


def collect_shard(store: Store, shard_id: str, reused: bool) -> ShardFacts:
    """Read one shard's generated manifest, journal, tokenized manifest and lengths."""
    facts = ShardFacts(shard_id, reused)
    facts.generated = read_json(store, output_keys(shard_id)[1])
    parquet_key, _, manifest_key = tokenized_keys(shard_index(shard_id))
    facts.tokenized = read_json(store, manifest_key)
    # The journal's final record per id is exactly what the generated file was built from.
    for rec in load_journal_records(store, shard_id).values():
        if rec.get("status") == "completed":
            facts.completions.append(_completion(rec))
        elif rec.get("status") == "failed":
            facts.failed_attempts.append(int(rec.get("attempts") or 1))
    if facts.tokenized is not None and store.exists(parquet_key):
        facts.tokenized_lengths = _parquet_lengths(store, parquet_key)
    return facts
