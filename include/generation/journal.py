"""The per-shard generation journal: every finished prompt, recorded as it finishes.

A shard run reads its journal first and sends only prompts without a line, so a killed run
resumes where it stopped; the shard's output is built from the journal, first line per id,
so no prompt appears twice. Two forms behind one interface:

* ``FileJournal``: one append-only JSONL file on this worker. Each line is written with one
  ``write`` and flushed to the OS, so a killed process loses nothing it reported finished.
* ``StoreJournal``: immutable segments in a ``Store`` (local directory or S3), so a retry on
  another worker resumes too. Lines are buffered and written as a new segment every
  ``flush_every`` lines or ``flush_interval_s`` seconds; a kill loses at most that window,
  whose prompts are simply generated again (never twice into the output).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from include.storage import Store


class Journal(Protocol):
    """Where a shard's finished prompts are recorded."""

    def load(self) -> dict[str, dict[str, Any]]:
        """Return every recorded line by prompt id (the first line per id wins)."""
        ...

    def append(self, record: dict[str, Any]) -> None:
        """Record one finished prompt."""
        ...

    def flush(self) -> None:
        """Make every appended line durable."""
        ...

    def flush_if_due(self) -> None:
        """Flush lines buffered longer than the journal's interval (call it now and then)."""
        ...

    def close(self) -> None:
        """Flush and release the journal."""
        ...


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def merge_lines(lines: list[bytes], into: dict[str, dict[str, Any]]) -> None:
    """Add journal lines to ``into`` by id: the first line per id wins, torn lines are skipped."""
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line from a crash mid-write: its prompt is simply redone
        into.setdefault(record["id"], record)


class FileJournal:
    """A journal in one local append-only file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and self.path.stat().st_size > 0 and not \
            self.path.read_bytes().endswith(b"\n")
        self._fh = open(self.path, "ab")  # noqa: SIM115 - owned by the journal, closed in close()
        if torn:  # a crash mid-line: end it, so the next record is not glued to its remains
            self._fh.write(b"\n")

    def load(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            merge_lines(self.path.read_bytes().splitlines(), out)
        return out

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(_encode(record))
        self._fh.flush()

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def flush_if_due(self) -> None:
        pass  # every line already reached the OS when it was appended

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()


class StoreJournal:
    """A journal as immutable segments under ``prefix`` in a ``Store``."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        flush_every: int = 256,
        flush_interval_s: float = 2.0,
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        # A writer id per journal object: two workers on one shard never write the same key.
        self._writer = uuid.uuid4().hex[:12]
        self._seq = 0
        self._buffer: list[bytes] = []
        self._first_buffered = 0.0

    def load(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for key in self.store.list(self.prefix):
            if key.endswith(".jsonl"):
                merge_lines(self.store.read(key).splitlines(), out)
        return out

    def append(self, record: dict[str, Any]) -> None:
        if not self._buffer:
            self._first_buffered = time.monotonic()
        self._buffer.append(_encode(record))
        if (
            len(self._buffer) >= self.flush_every
            or time.monotonic() - self._first_buffered >= self.flush_interval_s
        ):
            self.flush()

    def flush_if_due(self) -> None:
        if self._buffer and time.monotonic() - self._first_buffered >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        key = f"{self.prefix}part-{time.time_ns():020d}-{self._writer}-{self._seq:06d}.jsonl"
        self.store.write_new(key, data)
        self._seq += 1
        self._buffer = []

    def close(self) -> None:
        self.flush()
