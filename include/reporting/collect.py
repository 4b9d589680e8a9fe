"""Read what a run wrote (manifests, report facts, tokenized lengths) into per-shard facts.

Only the files of the run are read, each for the figures it is the source of truth for (see
``SOURCES_OF_TRUTH`` in ``include.reporting.build``): no completion's text or token ids (see
``include.reporting.facts``), except for a shard published before the facts existed.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from include.durability.journal import load_journal_records
from include.layout import facts_key, output_keys, shard_index, tokenized_keys
from include.reporting.facts import Completion, completion, decode_facts
from include.storage import Store, StoreError, sha256_hex


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
    #: ``(source, length)`` of every tokenized sample (the tokenized manifest's ``lengths``).
    tokenized_lengths: list[tuple[str, int]] = field(default_factory=list)


def read_json(store: Store, key: str) -> dict[str, Any] | None:
    """Return the JSON object at ``key``, or None when it does not exist."""
    if not store.exists(key):
        return None
    return json.loads(store.read(key))


def _parquet_lengths(store: Store, key: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    # Two scalar columns only: the token lists are what makes these files large.
    table = pq.read_table(io.BytesIO(store.read(key)), columns=["source", "length"])
    return list(zip(table.column("source").to_pylist(), table.column("length").to_pylist(),
                    strict=True))


def collect_shard(store: Store, shard_id: str, reused: bool) -> ShardFacts:
    """Read one shard's generated manifest, report facts and tokenized manifest.

    The facts file (``reporting.facts``) and the tokenized manifest's ``lengths`` hold what
    the report counts of every row; a shard published before them is read from its journal
    and its parquet's columns, as it was then.
    """
    facts = ShardFacts(shard_id, reused)
    facts.generated = read_json(store, output_keys(shard_id)[1])
    index = shard_index(shard_id)
    parquet_key, _, manifest_key = tokenized_keys(index)
    facts.tokenized = read_json(store, manifest_key)
    read = _read_facts(store, index, facts.generated)
    if read is not None:
        facts.completions, facts.failed_attempts = read
    else:
        # The journal's final record per id is exactly what the generated file was built from.
        for rec in load_journal_records(store, shard_id).values():
            if rec.get("status") == "completed":
                facts.completions.append(completion(rec))
            elif rec.get("status") == "failed":
                facts.failed_attempts.append(int(rec.get("attempts") or 1))
    lengths = (facts.tokenized or {}).get("lengths")
    if isinstance(lengths, dict):
        facts.tokenized_lengths = [(src, n) for src, ns in sorted(lengths.items()) for n in ns]
    elif facts.tokenized is not None and store.exists(parquet_key):
        facts.tokenized_lengths = _parquet_lengths(store, parquet_key)
    return facts


def _read_facts(store: Store, index: int, generated: dict[str, Any] | None
                ) -> tuple[list[Completion], list[int]] | None:
    """Return the shard's facts if its manifest vouches for a facts file, else None."""
    key = facts_key(index)
    listed = ((generated or {}).get("files") or {}).get(key)
    if not listed:
        return None
    data = store.read(key)
    if sha256_hex(data) != listed["sha256"]:
        raise StoreError(f"{store.uri(key)} has sha256 {sha256_hex(data)}, its manifest says "
                         f"{listed['sha256']}: the shard's published files were changed")
    return decode_facts(data)
