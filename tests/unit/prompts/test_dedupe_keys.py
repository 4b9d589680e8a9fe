"""The column-wise dedupe over compact keys gives what the row-by-row loop it replaced gave."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from include.prompts.dedupe import Candidates, KeySet, dedupe, halves, repeats
from include.prompts.funnel import SAMPLE_IDS_PER_REASON, SourceFunnel


def _key(n: int, half: int | None = None) -> bytes:
    """Return key ``n``; with ``half``, one whose first 8 bytes are those of key ``half``."""
    rng = random.Random(n)
    key = rng.randbytes(16)
    return _key(half)[:8] + key[8:] if half is not None else key


def _candidates(tmp_path: Path, name: str, keys: list[bytes]) -> Candidates:
    out = Candidates(SourceFunnel(name), str(tmp_path / f"{name}.jsonl"))
    with open(out.path, "wb") as fh:
        for c, key in enumerate(keys):
            line = json.dumps({"id": f"{name}:{c}", "pad": "x" * (c % 5)}).encode() + b"\n"
            fh.write(line)
            out.ends.append(fh.tell())
            out.keys += key
    return out


def _loop(si: int, candidates: Candidates, existing: set[bytes],
          seen: dict[bytes, int]) -> tuple[list[int], Counter, dict[str, list[str]]]:
    """The dedupe loop the column-wise one replaced (prepare.py before issue 14)."""
    kept, dropped, samples = [], Counter(), {}
    keys = [bytes(candidates.keys[16 * c : 16 * (c + 1)]) for c in range(len(candidates.ends))]
    for c, key in enumerate(keys):
        if key in existing:
            reason = "already_in_existing_set"
        elif key in seen:
            reason = "duplicate_within_source" if seen[key] == si else "duplicate_across_sources"
        else:
            seen[key] = si
            kept.append(c)
            continue
        dropped[reason] += 1
        bucket = samples.setdefault(reason, [])
        if len(bucket) < SAMPLE_IDS_PER_REASON:
            bucket.append(candidates.row_id(c))
    return kept, dropped, samples


@pytest.mark.parametrize("seed", range(6))
def test_dedupe_equals_the_row_by_row_loop(tmp_path, seed) -> None:
    rng = random.Random(seed)
    pool = [_key(i) for i in range(60)] + [_key(1000 + i, half=i) for i in range(10)]
    existing = set(rng.sample(pool, 8))
    existing_keys = KeySet.of(b"".join(list(existing) + list(existing)[:3]))
    assert len(existing_keys) == len(existing)
    seen_loop: dict[bytes, int] = {}
    seen = KeySet()
    for si in range(4):
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 120))]
        candidates = _candidates(tmp_path, f"s{si}", keys)
        kept, dropped, samples = _loop(si, candidates, existing, seen_loop)
        got = dedupe(candidates, existing_keys, seen)
        ends = list(candidates.ends)
        assert got.starts.tolist() == [ends[c - 1] if c else 0 for c in kept]
        assert got.lengths.tolist() == [ends[c] - (ends[c - 1] if c else 0) for c in kept]
        assert candidates.funnel.kept == len(kept)
        assert +candidates.funnel.dropped == dropped
        assert candidates.funnel.samples == samples
        assert len(seen) == len(seen_loop)


def test_keys_sharing_their_first_half_are_told_apart() -> None:
    keys = [_key(1), _key(2, half=1), _key(3, half=1), _key(4)]
    hi, lo = halves(b"".join(keys))
    assert len(set(hi.tolist())) == 2
    held = KeySet.of(b"".join(keys[:2]))
    assert held.contains(hi, lo).tolist() == [True, True, False, False]
    assert repeats(*halves(b"".join(keys + keys[1:3]))).tolist() == [
        False, False, False, False, True, True
    ]


def test_an_empty_key_set_holds_nothing() -> None:
    hi, lo = halves(b"".join([_key(1), _key(2)]))
    assert KeySet().contains(hi, lo).tolist() == [False, False]
    assert len(KeySet.of(b"")) == 0
    assert KeySet.of(b"").contains(*halves(b"")).dtype == np.bool_
