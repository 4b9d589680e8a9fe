"""The per-shard generation journal: every finished prompt, recorded as it finishes.

A shard run reads its journal first and sends only prompts without a line, so a killed run
resumes where it stopped; the shard's output is built from the journal, first line per id,
so no prompt appears twice. Two forms behind one interface:

* ``FileJournal``: one append-only JSONL file on this worker. Each line is written with one
  ``write`` and flushed to the OS, so a killed process loses nothing it reported finished.
* ``StoreJournal``: immutable segments in a ``Store`` (local directory or S3), so a retry on
  another worker resumes too. One writer thread puts the segments, in order, off the event
  loop (a slow PUT never stalls requests or health probes); see its docstring for how much a
  kill can lose (those prompts are simply generated again, never twice into the output).
  Once the shard is published its segments are also written as one object (``compact``),
  which readers then take instead of one GET per segment.

Every finished prompt has one final record: the first line per id, except that a retryable
failure (connection, timeout, 5xx, queue full) is replaced by any later line for its id, so
a re-run tries those prompts again and its result wins. "First" is in the order ``fencing``
keeps the segments in.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import msgspec

from include.durability.fencing import list_vouched
from include.jsonl import escape_break_bytes
from include.layout import compacted_keys, journal_prefix, segment_key
from include.outcomes import END_KIND, RETRYABLE, TURN_KIND, PromptStatus
from include.storage import Store, sha256_hex, write_verified

log = logging.getLogger(__name__)
#: Segments read at once when a journal is loaded (each is one GET on S3).
LOAD_THREADS = 16


class Journal(Protocol):
    """Where a shard's finished prompts are recorded."""

    def load(self) -> dict[str, dict[str, Any]]:
        """Return the final record per prompt id (see ``merge_record``)."""
        ...

    def append(self, record: dict[str, Any]) -> None:
        """Record one finished prompt."""
        ...

    def flush(self) -> None:
        """Make every appended line durable."""
        ...

    def flush_if_due(self) -> None:
        """Raise the error of a background write, if one failed; never blocks."""
        ...

    def close(self) -> None:
        """Flush and release the journal."""
        ...


def _encode(record: dict[str, Any]) -> bytes:
    # msgspec writes the JSON json.dumps(ensure_ascii=False, separators=(",", ":")) does (a
    # float's exponent aside, the same value) in a tenth of the time: a completion record is
    # mostly the server's token ids, and this ran once per request (bench_client_overhead).
    return escape_break_bytes(msgspec.json.encode(record)) + b"\n"


def is_final(record: dict[str, Any]) -> bool:
    """Return whether a journal record ends its prompt for good (all but retryable failures).

    A conversation that ended on a retryable failure after some turns is written as completed
    (its turns are exact rows) with ``end.retryable``: final for this run only, continued at
    its next turn by a re-run.
    """
    if (record.get("end") or {}).get("retryable"):
        return False
    return record.get("status") != PromptStatus.FAILED or record.get("reason") not in RETRYABLE


#: Journal records that do not end a prompt: a whole conversation's finished turns (and
#: ends), which a retry continues from (``include.conversations.resume``).
PER_TURN_KINDS = frozenset({TURN_KIND, END_KIND})


def prompt_records(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the records that end a prompt (one per prompt id), without per-turn records."""
    return {k: r for k, r in records.items() if r.get("kind") not in PER_TURN_KINDS}


def merge_record(into: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    """Add one record to ``into`` by id: the first final record wins; a retryable failure
    gives way to any later record of its id."""
    old = into.get(record["id"])
    if old is None or not is_final(old):
        into[record["id"]] = record


def merge_lines(lines: list[bytes], into: dict[str, dict[str, Any]]) -> None:
    """Add journal lines to ``into`` in order (see ``merge_record``); torn lines are skipped."""
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line from a crash mid-write: its prompt is simply redone
        merge_record(into, record)


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
        pass  # every line already reached the OS when it was appended; nothing runs behind

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()


class StoreJournal:
    """A journal as immutable segments under ``prefix`` in a ``Store``.

    ``append`` only buffers; one writer thread puts the buffered lines as a new segment, one
    PUT at a time and in order, starting a PUT at most every ``flush_interval_s`` seconds
    (at once when ``flush_every`` lines wait or ``flush`` is called). A PUT carries every
    line that arrived during the one before, so the pace follows the store's latency L.

    Bound: a line is in the store at most ``max(flush_interval_s, L) + L`` after it was
    appended; a kill loses at most the prompts finished in that window, which are generated
    again on resume (about 0.3 s with the default 0.25 s and S3's usual 20-100 ms PUTs; the
    old 256-line / 2 s window re-sent 18 of 124). A shard writes at most
    ``1 / flush_interval_s`` segments per second (4; about $0.07 an hour of S3 PUTs).

    A failed PUT stops the writer; the next ``append``, ``flush_if_due`` or ``flush`` raises
    its error, and the lines not written are generated again by the next try.

    ``fence`` (the shard lease's ``check``: raises once the lease is lost) runs before every
    PUT and in ``append`` and ``flush_if_due``, so a holder that lost the shard stops within
    the engine's next loop (about a second) and writes no segment after; ``tag`` (the lease
    generation, ``00000003``) starts the writer id in each segment's key, the fencing token
    on every segment (digits only: the writer id stays hex, as readers of the keys expect).
    A holder paused after its last check can still land a PUT late: readers fence that out
    by the segment's generation and number (``include.durability.fencing``). So the segments
    go out strictly one after another, numbered from 0: each writer's first n are the ones
    in the store.
    """

    def __init__(
        self,
        store: Store,
        prefix: str,
        flush_every: int = 256,
        flush_interval_s: float = 0.25,
        *,
        fence: Callable[[], None] | None = None,
        tag: str = "",
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self.fence = fence
        # A writer id per journal object: two workers on one shard never write the same key.
        self._writer = tag + uuid.uuid4().hex[:12]
        self._seq = 0
        self._cond = threading.Condition()
        self._buffer: list[bytes] = []
        self._writing = False
        self._flushers = 0
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._last_put = float("-inf")
        #: Segments written and the slowest PUT so far (seconds), for the log.
        self.segments = 0
        self.max_put_s = 0.0

    def load(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for _, data in read_segments(self.store, self.prefix):
            merge_lines(data.splitlines(), out)
        return out

    def append(self, record: dict[str, Any]) -> None:
        line = _encode(record)
        with self._cond:
            self._raise_error()
            self._fence()
            if self._closed:
                raise RuntimeError(f"journal {self.prefix} is closed; open a new StoreJournal")
            self._buffer.append(line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"journal-{self.prefix}",
                                                daemon=True)
                self._thread.start()
            # Wake the writer only when it has something new to decide, not on every line.
            if len(self._buffer) == 1 or len(self._buffer) == self.flush_every:
                self._cond.notify()

    def flush_if_due(self) -> None:
        with self._cond:
            self._raise_error()
            self._fence()

    def flush(self) -> None:
        """Put every appended line and wait until it is in the store."""
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while (self._buffer or self._writing) and self._error is None:
                    self._cond.wait()
            finally:
                self._flushers -= 1
            self._raise_error()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join()
            if self.segments:
                log.info("journal %s: %d segments, slowest PUT %.3fs", self.prefix,
                         self.segments, self.max_put_s)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _fence(self) -> None:
        if self.fence is not None:
            try:
                self.fence()
            except Exception as exc:  # the writer stops too: no segment after the loss
                self._error = exc
                self._cond.notify_all()
                raise

    def _next_lines(self) -> list[bytes] | None:
        """Wait until a PUT is due; return its lines (None: closed and nothing left)."""
        with self._cond:
            while True:
                if self._error is not None:
                    return None
                if self._buffer:
                    wait = self._last_put + self.flush_interval_s - time.monotonic()
                    if (wait <= 0 or self._flushers or self._closed
                            or len(self._buffer) >= self.flush_every):
                        lines, self._buffer = self._buffer, []
                        self._writing = True
                        return lines
                    self._cond.wait(wait)
                elif self._closed:
                    return None
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while (lines := self._next_lines()) is not None:
            start = time.monotonic()
            error = None
            try:
                if self.fence is not None:
                    self.fence()  # a lost lease: these lines would be a late write; refused
                key = segment_key(self.prefix, time.time_ns(), self._writer, self._seq)
                self.store.write_new(key, b"".join(lines))
            except Exception as exc:  # surfaced to the engine by the next append or flush
                error = exc
                log.error("journal %s: writing a segment of %d lines failed: %s",
                          self.prefix, len(lines), exc)
            with self._cond:
                self._last_put = start
                self._writing = False
                if error is None:
                    self._seq += 1
                    self.segments += 1
                    self.max_put_s = max(self.max_put_s, time.monotonic() - start)
                else:
                    self._error = error
                self._cond.notify_all()


def read_segments(store: Store, prefix: str) -> list[tuple[str, bytes]]:
    """Return the journal's segments as ``(key, bytes)`` in merge order: only those the
    newest lease generation counts (``include.durability.fencing``: a write that landed after
    a takeover is never read).

    A compacted journal is its one object, then any segment it does not hold (none, unless
    something wrote after the shard was published), so a reader sends one GET, not one per
    segment, and merging gives the same records as the segments did.
    """
    prefix = prefix.rstrip("/") + "/"
    data_key, index_key = compacted_keys(prefix)
    out: list[tuple[str, bytes]] = []
    covered: set[str] = set()
    if store.exists(index_key):
        covered = set(json.loads(store.read(index_key))["parts"])
        out.append((data_key, store.read(data_key)))
    rest, _ = list_vouched(store, prefix, covered)
    if rest:
        # Segments are small and many; read them at once, merge them in key order.
        with ThreadPoolExecutor(min(LOAD_THREADS, len(rest))) as pool:
            out.extend(zip(rest, pool.map(store.read, rest), strict=True))
    return out


def compact(store: Store, prefix: str,
            segments: list[tuple[str, bytes]] | None = None) -> bool:
    """Write a published shard's journal segments as one object; return whether it did.

    The object is the segments' lines in merge order (not only the final records), so
    ``load`` merges to exactly what the segments gave: resume semantics are kept. The
    segments stay (the store never deletes); readers of the journal (the report, a resume)
    read one object instead of thousands. ``segments`` is what the caller already read.
    Call it only once the shard's manifest exists: nothing legitimate writes after that.
    """
    data_key, index_key = compacted_keys(prefix)
    if store.exists(index_key):
        return False
    if segments is None:
        segments = read_segments(store, prefix)
    parts = [k for k, _ in segments if k != data_key]
    if len(parts) < 2:
        return False  # one segment is already one read
    data = b"".join(d if d.endswith(b"\n") else d + b"\n" for k, d in segments
                    if k != data_key)
    write_verified(store, data_key, data)
    index = {"parts": parts, "sha256": sha256_hex(data), "bytes": len(data)}
    write_verified(store, index_key, json.dumps(index, indent=1).encode())
    log.info("journal %s: %d segments compacted into %s (%d bytes)", prefix, len(parts),
             data_key, len(data))
    return True


def load_journal_records(store: Store, shard_id: str) -> dict[str, dict[str, Any]]:
    """Return the final journal record per prompt id of a shard (no per-turn records)."""
    return prompt_records(StoreJournal(store, journal_prefix(shard_id)).load())
