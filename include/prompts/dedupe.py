"""Dedupe: drop the candidates whose normalised prompt was seen before, over compact keys.

Sources are processed in settings order and rows in file order; the first occurrence of a
normalised prompt is kept and later ones are dropped as ``duplicate_within_source`` or
``duplicate_across_sources``; a prompt of a ``dedupe_against`` set drops every candidate
holding it (``already_in_existing_set``). Only 16-byte keys and file offsets stay in memory:
the candidates' JSON lines wait in a spool file.
"""

from __future__ import annotations

import json
import logging
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from include.prompts.errors import PrepareError
from include.prompts.funnel import SAMPLE_IDS_PER_REASON, SourceFunnel
from include.prompts.schemas import ROLE_NAMES
from include.prompts.turns import dedupe_key, prompt_turns
from include.settings import RunSettings
from include.storage import StoreError, open_readable

log = logging.getLogger(__name__)

#: The size of a dedupe key (``turns.dedupe_key``).
KEY_BYTES = 16


@dataclass
class Candidates:
    """One source's rows that passed every per-row check, before dedupe, in row order.

    Candidate ``c`` has dedupe key ``keys[16 * c : 16 * (c + 1)]`` and its JSON line at bytes
    ``[ends[c - 1], ends[c])`` of the file at ``path`` (``ends[-1]`` of nothing is 0). The
    funnel holds the source's reads and per-row drops; dedupe and quotas come after.
    """

    funnel: SourceFunnel
    path: str
    keys: bytearray = field(default_factory=bytearray)
    ends: array = field(default_factory=lambda: array("q"))

    def line(self, c: int) -> bytes:
        start = self.ends[c - 1] if c else 0
        with open(self.path, "rb") as fh:
            fh.seek(start)
            return fh.read(self.ends[c] - start)

    def row_id(self, c: int) -> str:
        # Only drop samples need a candidate's id after the per-row work (a few per source),
        # so it is read back from its line instead of being kept for every row.
        return json.loads(self.line(c))["id"]


@dataclass
class Kept:
    """A source's kept prompts after dedupe: line ``i`` is at ``starts[i]`` in ``path``."""

    path: str
    starts: np.ndarray
    lengths: np.ndarray


class KeySet:
    """Distinct dedupe keys, 16 bytes each: two arrays of their halves, sorted by the first.

    A Python set of 16-byte ``bytes`` takes about 100 bytes a key (the object and its slot),
    most of the stage's memory at the 3.5M prompts of the published sources. Keys are 128-bit
    blake2b digests of the normalised prompt: the chance that two different prompts among n
    share one is below n^2 / 2^129 (2^-85 at 3.5M prompts, 2^-82 at ten million), so equal
    keys are taken as equal prompts.
    """

    def __init__(self, hi: np.ndarray | None = None, lo: np.ndarray | None = None) -> None:
        self.hi = _NO_KEYS if hi is None else hi
        self.lo = _NO_KEYS if lo is None else lo

    @classmethod
    def of(cls, keys: bytes | bytearray) -> KeySet:
        """Return the distinct keys among ``keys`` (16 bytes each, concatenated)."""
        hi, lo = halves(keys)
        new = ~repeats(hi, lo)
        out = cls()
        out.add(hi[new], lo[new])
        return out

    def __len__(self) -> int:
        return len(self.hi)

    def add(self, hi: np.ndarray, lo: np.ndarray) -> None:
        """Add keys (given by their halves) that are not in the set yet."""
        # Merged in one pass, not sorted again: a source of a thousand rows after millions of
        # kept keys costs a copy of them, not a sort.
        order = np.argsort(hi, kind="stable")
        where = np.searchsorted(self.hi, hi[order])
        self.hi = np.insert(self.hi, where, hi[order])
        self.lo = np.insert(self.lo, where, lo[order])

    def contains(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Return, for each key given by its halves, whether the set holds it."""
        left = np.searchsorted(self.hi, hi, "left")
        right = np.searchsorted(self.hi, hi, "right")
        found = np.zeros(len(hi), dtype=bool)
        one = right - left == 1  # nearly always: first halves are 64 random bits
        found[one] = self.lo[left[one]] == lo[one]
        for q in np.flatnonzero(right - left > 1).tolist():  # keys sharing their first half
            found[q] = bool((self.lo[left[q] : right[q]] == lo[q]).any())
        return found


_NO_KEYS = np.empty(0, dtype=np.uint64)


def halves(keys: bytes | bytearray) -> tuple[np.ndarray, np.ndarray]:
    """Return the first and second 8 bytes of each 16-byte key, as two uint64 arrays."""
    pairs = np.frombuffer(keys, dtype=np.uint64).reshape(-1, 2)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


def repeats(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Return, for each key of a sequence, whether an earlier key of the sequence equals it."""
    order = np.lexsort((lo, hi))  # stable: equal keys stay in sequence order
    h, low = hi[order], lo[order]
    same = (h[1:] == h[:-1]) & (low[1:] == low[:-1])
    repeat = np.zeros(len(hi), dtype=bool)
    repeat[order[1:][same]] = True
    return repeat


def dedupe(candidates: Candidates, existing: KeySet, seen: KeySet) -> Kept:
    """Drop the candidates seen before (existing sets, earlier rows); return the kept ones.

    The same outcome as taking the candidates one by one in row order: a key in ``existing``
    drops every candidate holding it, as does a key an earlier source kept (``seen``); of
    the rest, the first candidate with a key is kept and later ones are duplicates. The kept
    keys join ``seen``.
    """
    funnel = candidates.funnel
    hi, lo = halves(candidates.keys)
    in_existing = existing.contains(hi, lo)
    earlier = seen.contains(hi, lo) & ~in_existing
    repeat = repeats(hi, lo) & ~(in_existing | earlier)
    for reason, mask in (
        ("already_in_existing_set", in_existing),
        ("duplicate_within_source", repeat),
        ("duplicate_across_sources", earlier),
    ):
        dropped = np.flatnonzero(mask)
        if len(dropped):
            funnel.dropped[reason] += len(dropped)
            # Only the few sample ids are read back from the candidates' lines.
            samples = funnel.samples.setdefault(reason, [])
            for c in dropped[: SAMPLE_IDS_PER_REASON - len(samples)].tolist():
                samples.append(candidates.row_id(c))
    chosen = np.flatnonzero(~(in_existing | earlier | repeat))
    seen.add(hi[chosen], lo[chosen])
    funnel.kept = len(chosen)
    ends = np.frombuffer(candidates.ends, dtype=np.int64)
    starts = np.where(chosen > 0, ends[chosen - 1], 0)  # candidate c starts where c - 1 ends
    return Kept(candidates.path, starts, ends[chosen] - starts)


def load_existing_keys(settings: RunSettings) -> KeySet:
    """Return the dedupe keys of every prompt in the ``dedupe_against`` sets.

    Each location is opened read-only with the run's S3 connection: it may well lie under a
    protected prefix (the original completions), and is never written.
    """
    keys = bytearray()
    for location in settings.dedupe_against:
        try:
            store, name = open_readable(location, s3_conn_id=settings.deployment.s3_conn_id)
            names = [k for k in store.list(name) if k.endswith((".jsonl", ".json"))]
        except StoreError as exc:
            raise PrepareError(f"setting `dedupe_against`: {exc}") from None
        if not names:
            raise PrepareError(
                f"setting `dedupe_against`: {location!r} does not exist or holds no .jsonl/.json "
                "files; fix the location or remove it"
            )
        before = len(keys)
        for name in names:
            # Streamed: a dedupe set may be many gigabytes; only its 16-byte keys are kept.
            for lineno, line in enumerate(store.iter_lines(name), 1):
                if not line.strip():
                    continue
                messages = _existing_messages(location, name, lineno, line)
                if messages:
                    keys += dedupe_key(prompt_turns(messages))
        log.info("dedupe_against %s: %d prompts", location, (len(keys) - before) // KEY_BYTES)
    return KeySet.of(keys)


def _existing_messages(location: str, name: str, lineno: int, line: bytes) -> list[dict] | None:
    # Earlier prompt shards carry `messages`; SpecForge-style training sets carry
    # `conversations` with role/content (or from/value); both are accepted.
    try:
        record = json.loads(line)
        turns = record.get("messages") or record.get("conversations") or []
        return [
            {
                "role": _role(t.get("role") or t.get("from")),
                "content": t.get("content") if "content" in t else t.get("value"),
            }
            for t in turns
        ]
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        raise PrepareError(
            f"setting `dedupe_against`: {location} {name} line {lineno} is not a prompt record "
            f"({exc}); expected JSON lines with `messages` or `conversations`"
        ) from None


def _role(name: Any) -> str:
    return ROLE_NAMES.get(str(name).lower(), str(name))
