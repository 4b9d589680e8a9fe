"""Where a run's files live: one create-only interface over a local directory or S3."""

from include.storage.store import (
    LocalStore,
    ObjectExistsError,
    Store,
    StoreError,
    open_store,
    sha256_hex,
)

__all__ = ["LocalStore", "ObjectExistsError", "Store", "StoreError", "open_store", "sha256_hex"]
