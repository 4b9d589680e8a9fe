"""What every store is: the ``Store`` protocol and the content hash objects are checked by.

Apart from ``store.py`` (local stores, opening) and ``s3.py`` (the S3 store), so that both
implementations share them without importing each other.
"""

from __future__ import annotations

import hashlib
from typing import Protocol


def sha256_hex(data: bytes) -> str:
    """Return the hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class Store(Protocol):
    """A key/value store of immutable objects under one root location."""

    root: str

    def uri(self, key: str) -> str:
        """Return the full location of ``key`` (for logs and manifests)."""
        ...

    def write_new(self, key: str, data: bytes) -> bool:
        """Create ``key``; return False if it already held the same bytes.

        Raises ObjectExistsError if it holds different bytes.
        """
        ...

    def read(self, key: str) -> bytes:
        """Return the bytes at ``key``; raise FileNotFoundError if absent."""
        ...

    def exists(self, key: str) -> bool:
        """Return whether ``key`` exists."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Return every key under ``prefix``, sorted."""
        ...
