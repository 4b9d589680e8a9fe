"""Prove a store create-only before a run writes to it: a key written twice must be refused.

Create-only writes on S3 rest on ``If-None-Match: *``. AWS S3 and current MinIO honour it;
older MinIO releases and several S3-compatible stores ignore it and overwrite, and nothing in
a single write shows it (the post-write checksum reads back the new bytes and passes). So the
output root is probed once: a probe key is written, then written again with other bytes, and
the second write must be refused. A store that overwrites is refused with its name and what
to do. A store that passed leaves a marker (written create-only, named after the endpoint,
bucket and prefix), so each root and deployment is probed once, not on every run.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from include.storage.errors import StoreError

#: Where probe keys and markers live, under the output root.
PROBE_FOLDER = "_regen/create-only"


def _marker_key(store: Any) -> str:
    identity = json.dumps([getattr(store, "endpoint", ""), store.root])
    return f"{PROBE_FOLDER}/proven-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"


def prove_create_only(store: Any) -> str:
    """Return how ``store`` was found create-only ("proven before" or "probed now").

    Raise StoreError naming the store when a second write of one key was not refused. A
    local directory is create-only by construction (``O_EXCL``) and is not probed.
    """
    if not hasattr(store, "try_create"):
        return "create-only by construction"
    marker = _marker_key(store)
    if store.exists(marker):
        return "proven before"
    probe = f"{PROBE_FOLDER}/probe-{uuid.uuid4().hex}"
    if not store.try_create(probe, b"first"):
        raise StoreError(f"{store.uri(probe)}: a fresh probe key was refused as existing")
    if store.try_create(probe, b"second"):
        raise StoreError(
            f"the store at {store.root} (endpoint {getattr(store, 'endpoint', '?')}) "
            "overwrote an existing key although the write asked If-None-Match: *; it would "
            f"silently replace published data (probe {store.uri(probe)}). Use a store that "
            "honours conditional writes (AWS S3, or MinIO RELEASE.2024-11 or newer), or "
            "another output_root."
        )
    record = {"proven_at": round(time.time(), 3), "probe": probe,
              "endpoint": getattr(store, "endpoint", ""), "root": store.root}
    store.write_new(marker, json.dumps(record, sort_keys=True).encode())
    return "probed now"
