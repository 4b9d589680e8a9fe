"""What every store is: the ``Store`` protocol and the content hash objects are checked by.

Apart from ``store.py`` (local stores, opening) and ``s3.py`` (the S3 store), so that both
implementations share them without importing each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Protocol

#: The longest line ``iter_lines`` yields: a longer one is not a prompt record, and reading
#: it whole would hold an unbounded object in memory.
MAX_LINE_BYTES = 16 * 1024 * 1024


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

    def iter_lines(self, key: str) -> Iterator[bytes]:
        """Yield the lines of ``key`` one at a time (memory bounded by ``MAX_LINE_BYTES``)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Return every key under ``prefix``, sorted."""
        ...

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        """Return the keys directly in folder ``prefix`` and its sub-folders, each sorted.

        One level only (S3's ``Delimiter='/'``): sub-folders come back as prefixes ending in
        ``/`` (``journal/shard-00001/``), not as the keys under them, so a folder of a
        million journal segments costs one entry. ``"journal"`` and ``"journal/"`` are the
        same folder; ``""`` is the root.
        """
        ...


def split_lines(chunks: Iterator[bytes], where: str) -> Iterator[bytes]:
    """Yield the lines of a byte stream read in chunks; StoreError on an over-long line."""
    from include.storage.errors import StoreError

    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
            raise StoreError(f"{where}: a line longer than {MAX_LINE_BYTES} bytes; not a "
                             "JSON-lines file of records")
        yield from lines
    if pending:
        yield pending
