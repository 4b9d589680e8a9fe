"""What every store is: the ``Store`` protocol and the content hash objects are checked by.

Apart from ``store.py`` (local stores, opening) and ``s3.py`` (the S3 store), so that both
implementations share them without importing each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO, Protocol

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

    def write_new_concat(self, key: str, sources: Sequence[str]) -> tuple[int, str]:
        """Create ``key`` holding the objects at ``sources`` one after another, in order.

        Create-only as ``write_new``, in bounded memory (the sources are streamed, never
        read whole). Return the size in bytes and the SHA-256 hex of the whole; the same if
        ``key`` already held exactly those bytes (a retried task). ObjectExistsError if it
        holds other bytes; FileNotFoundError naming a missing source.
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


def read_chunks(files: Iterable[BinaryIO], chunk: int = 8 * 1024 * 1024) -> Iterator[bytes]:
    """Yield the bytes of ``files`` in order, ``chunk`` at a time, closing each when read."""
    for fh in files:
        with fh:
            yield from iter(lambda fh=fh: fh.read(chunk), b"")


def copy_hashed(files: Iterable[BinaryIO], write: Callable[[bytes], object]) -> tuple[int, str]:
    """Pass the bytes of ``files`` to ``write`` in order; return their size and SHA-256 hex."""
    digest = hashlib.sha256()
    size = 0
    for piece in read_chunks(files):
        digest.update(piece)
        size += len(piece)
        write(piece)
    return size, digest.hexdigest()


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
