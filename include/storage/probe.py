"""Prove a store create-only where a run writes, every run: a key written twice must be refused.

Create-only writes on S3 rest on ``If-None-Match: *``. AWS S3 and current MinIO honour it;
older MinIO releases and several S3-compatible stores ignore it and overwrite, and nothing in
a single write shows it (the post-write checksum reads back the new bytes and passes). So
before a run writes, a probe key in the run's own location is written, written again with
other bytes, then completed over by a one-part multipart upload, and both overwrites must be
refused. Nothing is remembered between runs: a store proven once can be moved behind a
gateway that drops the header, and a bucket policy or gateway can treat prefixes
differently, so the proof is a few requests where and when the run writes. A store that
overwrites is refused with its name and what to do.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from include.storage.errors import StoreError

#: Where probe keys live, under the location probed (docs/data-layout.md): a folder no stage,
#: trainer or the monitor reads.
PROBE_FOLDER = "_regen/create-only"


def probe_key() -> str:
    """Return a probe key no other probe uses (the time first, so a listing reads in order)."""
    return f"{PROBE_FOLDER}/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex}"


def prove_create_only(store: Any) -> str:
    """Return how ``store`` was found create-only; raise StoreError naming it if it is not.

    A local directory is create-only by construction (``O_EXCL`` links) and is not probed.
    Otherwise one probe key (``probe_key``) is created and then written over twice, by a
    PutObject and by a CompleteMultipartUpload, each asking ``If-None-Match: *``; both must be
    refused. About six requests; the probe key stays, holding its first bytes.
    """
    if not hasattr(store, "try_create"):
        return "create-only by construction"
    key = probe_key()
    endpoint = getattr(store, "endpoint", "?")
    first = json.dumps({"probe": "create-only", "at": round(time.time(), 3),
                        "endpoint": endpoint}, sort_keys=True).encode()
    if not store.try_create(key, first):
        raise StoreError(f"{store.uri(key)}: a fresh probe key was refused as existing")
    for how, multipart in (("PutObject", False), ("CompleteMultipartUpload", True)):
        if store.try_create(key, f"overwritten by {how}".encode(), multipart=multipart):
            raise StoreError(
                f"the store at {store.root} (endpoint {endpoint}) overwrote an existing key "
                f"on {how} although the request asked If-None-Match: *; it would silently "
                f"replace published data (probe {store.uri(key)})"
                + (", and two racing large (multipart) writes of one key would both succeed"
                   if multipart else "")
                + ". Use a store that honours conditional writes on PutObject and "
                "CompleteMultipartUpload (AWS S3, or MinIO RELEASE.2024-11 or newer), or "
                "another output_root."
            )
    return f"probed now at {store.uri(key)}"
