"""The near-duplicate filter: one answer given to different prompts (a template answer).

Within one shard, in record order: an answer whose word-shingle Jaccard similarity to an
earlier kept answer of *another* prompt is at least ``near_dup_jaccard`` is quarantined; the
first of each group is kept. Answers of fewer than ``near_dup_min_words`` different words
are not compared: short answers ("4", "Yes.") legitimately coincide, and so do answers made
mostly of a few symbols (a truth table of ``| T | F |``). Candidates come from MinHash with LSH
bands (16 bands of 4 hashes: a pair at Jaccard 0.75 shares a band with probability 0.998),
then the exact Jaccard decides, so the outcome does not depend on hash luck at the
threshold. Hashes are CRC-32 and fixed seeds: a retried shard quarantines the same rows.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Sequence

from include.quality.parts import Parts, QualityOptions

_BANDS, _ROWS = 16, 4
_PRIME = 4294967311  # the first prime above 2**32: a*x + b stays below 2**64
_SEED = 20261201


def _permutations() -> tuple[object, object]:
    import numpy as np

    rng = np.random.default_rng(_SEED)
    count = _BANDS * _ROWS
    a = rng.integers(1, 2**32 - 1, size=(count, 1), dtype=np.uint64)
    b = rng.integers(0, 2**32 - 1, size=(count, 1), dtype=np.uint64)
    return a, b


def shingle_hashes(words: Sequence[str], size: int, memo: dict[str, int] | None = None
                   ) -> object:
    """Return the sorted distinct 64-bit hashes of the word ``size``-grams (numpy uint64).

    Each word is hashed once (CRC-32) and a gram's hash combines its words' in order, in
    numpy: the same set as hashing each joined gram, without building the strings (the
    filter's cost on long answers). Distinct grams colliding in 64 bits is negligible.
    """
    import numpy as np

    memo = {} if memo is None else memo  # words repeat across a shard: hash each once
    for word in set(words).difference(memo):
        memo[word] = zlib.crc32(word.encode()) or 1
    w = np.fromiter(map(memo.__getitem__, words), np.uint64, len(words))  # no Python frames
    n = max(len(w) - size + 1, 1)
    h = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):  # wrapping arithmetic is the hash
        for j in range(min(size, len(w))):
            h = h * np.uint64(0x100000001B3) + w[j: j + n]
    return np.unique(h)


def _jaccard_hashed(a: object, b: object) -> float:
    import numpy as np

    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter  # type: ignore[arg-type]
    return inter / union if union else 0.0


def near_duplicates(items: Sequence[Parts], options: QualityOptions) -> dict[int, str]:
    """Return ``{index: detail}`` of the items that repeat an earlier kept item's answer."""
    import numpy as np

    a, b = _permutations()
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    sets: dict[int, object] = {}
    found: dict[int, str] = {}
    memo: dict[str, int] = {}
    for i, parts in enumerate(items):
        words = parts.answer.lower().split()
        if len(set(words)) < options.near_dup_min_words:
            continue
        grams = shingle_hashes(words, options.near_dup_shingle, memo)
        hashed = (grams >> np.uint64(32)) ^ (grams & np.uint64(0xFFFFFFFF))
        signature = ((a * hashed[None, :] + b) % _PRIME).min(axis=1).astype(np.uint32)
        keys = [(band, signature[band * _ROWS: (band + 1) * _ROWS].tobytes())
                for band in range(_BANDS)]
        candidates = sorted({j for key in keys for j in buckets.get(key, ())})
        best: tuple[float, int] | None = None
        for j in candidates:
            if items[j].prompt_key == parts.prompt_key:
                continue  # the same prompt twice may well get the same answer
            score = _jaccard_hashed(grams, sets[j])
            if score >= options.near_dup_jaccard and (best is None or score > best[0]):
                best = (score, j)
        if best is not None:
            found[i] = f"answer repeats {items[best[1]].id} (word-shingle Jaccard {best[0]:.2f})"
            continue
        sets[i] = grams
        for key in keys:
            buckets[key].append(i)
    return found
