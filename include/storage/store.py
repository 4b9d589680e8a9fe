"""Create-only object storage: a key, once written, is never overwritten.

Every stage writes through ``Store``. Writing a key that already holds identical bytes counts
as done (a retried task succeeds); writing different bytes raises ``ObjectExistsError`` and
leaves the existing object untouched. The local implementation lives here; the S3 one uses
conditional puts (``If-None-Match: *``) behind the same interface.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


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


#: The original training data's prefix; see ``protected_prefixes`` in include/settings.py.
DEFAULT_PROTECTED_PREFIXES: tuple[str, ...] = ("completions/",)


def _location_parts(location: str) -> tuple[str, tuple[str, ...]]:
    """Return ``(namespace, path segments)``: ``("s3://bucket", ...)`` or ``("file", ...)``."""
    if location.startswith("s3://"):
        rest = location[len("s3://") :]
        bucket, _, path = rest.partition("/")
        segments = tuple(p for p in path.split("/") if p)
        if not bucket or any(p in (".", "..") for p in segments):
            raise StoreError(
                f"location {location!r}: expected s3://bucket/prefix without '.' or '..' segments"
            )
        return f"s3://{bucket}", segments
    return "file", Path(os.path.abspath(location)).parts


def validate_output_location(
    uri: str, protected_prefixes: Sequence[str] = DEFAULT_PROTECTED_PREFIXES
) -> None:
    """Raise StoreError if ``uri`` is equal to, inside, or contains a protected prefix.

    A protected prefix is a full location (``s3://bucket/completions``, ``/data/completions``)
    or relative (``completions/``). For s3:// locations, relative ones (and ``/completions``)
    mean that folder at the root of the location's bucket; for local ones, any directory of
    that name (path segments) anywhere in the path. Trailing slashes do not matter; prefixes
    are whole path segments, so ``completions/`` does not protect ``completions-v2/``. Call it
    before any work.
    """
    namespace, segments = _location_parts(uri)
    hits: list[str] = []
    for prefix in protected_prefixes:
        if not prefix.strip("/"):
            raise StoreError(f"protected prefix {prefix!r} is empty: it would protect everything")
        # For s3:// outputs a leading "/" still means the bucket root: refusing too much is
        # safer than reading "/completions/" as a local path that protects nothing there.
        if prefix.startswith("s3://") or (namespace == "file" and os.path.isabs(prefix)):
            p_namespace, p_segments = _location_parts(prefix)
            if p_namespace != namespace:
                continue
            n = min(len(segments), len(p_segments))
            if segments[:n] == p_segments[:n]:  # equal, inside (n = len(p)) or containing
                hits.append(prefix)
            continue
        rel = tuple(p for p in prefix.split("/") if p)
        if namespace != "file":
            n = min(len(segments), len(rel))
            if segments[:n] == rel[:n]:
                hits.append(prefix)
        elif any(segments[i : i + len(rel)] == rel for i in range(len(segments))):
            hits.append(prefix)
    if hits:
        raise StoreError(
            f"output location {uri!r} (resolved: {_resolved(uri)}) is equal to, inside, or "
            f"contains protected prefix(es) {hits} (all protected: {list(protected_prefixes)}); "
            "nothing was written. Choose another output_uri/run_name, or change "
            "protected_prefixes if that location really is yours to write."
        )


def _resolved(uri: str) -> str:
    return uri.rstrip("/") if uri.startswith("s3://") else os.path.abspath(uri)


def open_store(
    uri: str,
    *,
    s3_conn_id: str = "aws_default",
    protected_prefixes: Sequence[str] = DEFAULT_PROTECTED_PREFIXES,
    read_only: bool = False,
) -> Store:
    """Return the store for ``uri``: ``s3://bucket/prefix`` or a local directory.

    For writing (the default) the location is first checked against ``protected_prefixes``
    (see ``validate_output_location``) and, for S3, the bucket and credentials are probed, so
    a misconfiguration fails before any work. ``read_only=True`` skips the protection check
    (reading protected data, e.g. for dedupe, is fine) and returns a store whose
    ``write_new`` raises StoreError.
    """
    if not read_only:
        validate_output_location(uri, protected_prefixes)
        log.info(
            "output location %s (protected prefixes: %s)",
            _resolved(uri),
            ", ".join(protected_prefixes) or "none",
        )
    store: Store
    if uri.startswith("s3://"):
        from include.storage.s3 import S3Store

        s3 = S3Store(uri, conn_id=s3_conn_id)
        s3.check_access()
        store = s3
    else:
        store = LocalStore(uri)
    return ReadOnlyStore(store) if read_only else store


class ReadOnlyStore:
    """Wrap a ``Store`` so that reads pass through and every write is refused."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.root = inner.root

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def write_new(self, key: str, data: bytes) -> bool:
        raise StoreError(
            f"{self.inner.uri(key)}: this store was opened read-only; open the output "
            "location with open_store(uri) to write"
        )

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)
