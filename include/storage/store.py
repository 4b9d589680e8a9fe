"""Create-only object storage: a key, once written, is never overwritten.

Every stage writes through ``Store``. Writing a key that already holds identical bytes counts
as done (a retried task succeeds); writing different bytes raises ``ObjectExistsError`` and
leaves the existing object untouched. The local implementation lives here; the S3 one uses
conditional puts (``If-None-Match: *``) behind the same interface.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol


class StoreError(RuntimeError):
    """A storage operation failed; the message names the location and what to do."""


class ObjectExistsError(StoreError):
    """A different object already exists at the key; nothing was overwritten."""


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


class LocalStore:
    """A ``Store`` over a local directory, for local runs and tests."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = str(Path(root))
        self._root = Path(root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in Path(key).parts:
            raise StoreError(f"refusing key {key!r}: keys are relative and never leave the root")
        return self._root / key

    def uri(self, key: str) -> str:
        return str(self._path(key))

    def write_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                # link() fails if the target exists: an atomic create-if-absent on POSIX.
                os.link(tmp, path)
                return True
            except FileExistsError:
                if path.read_bytes() == data:
                    return False
                raise ObjectExistsError(
                    f"{path} already exists with different content; nothing was overwritten. "
                    "Write to a new run_name (or output location) instead."
                ) from None
        finally:
            os.unlink(tmp)

    def read(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self._root
        if base.is_file():
            return [prefix]
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self._root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )


def open_store(uri: str) -> Store:
    """Return the store for ``uri``: ``s3://bucket/prefix`` or a local directory."""
    if uri.startswith("s3://"):
        raise StoreError(
            f"output location {uri!r}: S3 storage is not available in this build; "
            "use a local directory"
        )
    return LocalStore(uri)
