"""Publish a shard's outputs: data files first, then the manifest that vouches for them.

The manifest is the commit marker: a reader treats a shard as published once its manifest
exists, and the manifest records each file's SHA-256 and size. Everything is written
create-only and verified after upload, so a retried task that rebuilds the same bytes
completes without rewriting anything, and one that built different bytes fails loudly
instead of replacing published data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from include.layout import facts_key, generated_keys
from include.storage.base import Store, sha256_hex
from include.storage.errors import StoreError

log = logging.getLogger(__name__)


@dataclass
class PublishResult:
    """What a publish call did: the manifest as stored, and which keys it created."""

    manifest: dict[str, Any]
    written: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """Return the manifest's canonical bytes, so a retry writes identical ones: a manifest
    holds no wall-clock time or other per-attempt value."""
    return (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write_verified(store: Store, key: str, data: bytes) -> bool:
    """Create ``key`` with ``data`` and check what is stored; return False if already there.

    Stores that verify their own writes (``verifies_writes = True``, e.g. S3Store) are
    trusted; others are read back and hashed. Raises StoreError on a mismatch.
    """
    created = store.write_new(key, data)
    if not getattr(store, "verifies_writes", False):
        stored = sha256_hex(store.read(key))
        if stored != sha256_hex(data):
            raise StoreError(
                f"{store.uri(key)}: stored bytes have sha256 {stored}, expected "
                f"{sha256_hex(data)}; inspect the object (it is create-only)"
            )
    return created


def publish_files(
    store: Store, files: Mapping[str, bytes], manifest_key: str, manifest: Mapping[str, Any]
) -> PublishResult:
    """Write ``files`` (key -> bytes), then ``manifest`` with ``files`` entries added.

    The stored manifest is ``manifest`` plus ``"files": {key: {"sha256", "bytes"}}`` for every
    file (keys relative to the store root). Raises ObjectExistsError if any key already holds
    different bytes; nothing is overwritten, and the manifest is not written in that case.
    """
    if manifest_key in files:
        raise ValueError(f"{manifest_key!r} is both a data file and the manifest")
    stored = dict(manifest)
    stored["files"] = {
        key: {"sha256": sha256_hex(data), "bytes": len(data)} for key, data in sorted(files.items())
    }
    result = PublishResult(manifest=stored)
    for key, data in sorted(files.items()):
        created = write_verified(store, key, data)
        (result.written if created else result.already_present).append(key)
    created = write_verified(store, manifest_key, encode_manifest(stored))
    (result.written if created else result.already_present).append(manifest_key)
    log.info(
        "published %s: wrote %s, already present %s",
        store.uri(manifest_key),
        result.written or "nothing",
        result.already_present or "nothing",
    )
    return result


def publish_generated_shard(
    store: Store, shard_index: int, jsonl: bytes, manifest: Mapping[str, Any],
    facts: bytes | None = None,
) -> PublishResult:
    """Publish ``generated/shard-NNNNN.jsonl``, its report facts (``include.reporting.facts``)
    and its manifest, with the .jsonl's ``sha256``/``bytes`` (docs/data-layout.md)."""
    data_key, manifest_key = generated_keys(shard_index)
    full = {**manifest, "sha256": sha256_hex(jsonl), "bytes": len(jsonl)}
    files = {data_key: jsonl, **({facts_key(shard_index): facts} if facts is not None else {})}
    return publish_files(store, files, manifest_key, full)
