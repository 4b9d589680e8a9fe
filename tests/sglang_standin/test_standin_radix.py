"""The radix-cache model (SGLang mem_cache/radix_cache.py): prefix matches, LRU eviction."""

from __future__ import annotations

import random
import time

from sglang_standin.radix import RadixCache


def test_match_is_the_longest_cached_prefix_shared_across_sequences() -> None:
    cache = RadixCache(1000)
    assert cache.match_prefix([1, 2, 3]) == 0
    cache.insert([1, 2, 3, 4, 5])
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]) == 5
    assert cache.match_prefix([1, 2, 9]) == 2
    assert cache.match_prefix([2, 1]) == 0
    cache.insert([1, 2, 7, 8])  # splits the edge after [1, 2]
    assert cache.size == 7
    assert cache.match_prefix([1, 2, 7, 8, 9]) == 4
    assert cache.match_prefix([1, 2, 3, 4]) == 4
    cache.insert([1, 2, 3])  # already held: nothing added
    assert cache.size == 7
    cache.reset()
    assert cache.size == 0 and cache.match_prefix([1, 2]) == 0


def test_least_recently_used_leaves_go_first_when_full() -> None:
    cache = RadixCache(10)
    cache.insert([1, 1, 1, 1])
    cache.insert([2, 2, 2, 2])
    cache.match_prefix([1, 1])  # touches the first sequence
    cache.insert([3, 3, 3, 3])  # 12 > 10: the least recently used leaf ([2...]) goes
    assert cache.size == 8
    assert cache.match_prefix([2, 2, 2, 2]) == 0
    assert cache.match_prefix([1, 1, 1, 1]) == 4 and cache.match_prefix([3, 3, 3, 3]) == 4
    # A shared prefix outlives its leaves only as long as it is itself a leaf's ancestor.
    small = RadixCache(6)
    small.insert([5, 6, 7, 8])
    small.insert([5, 6, 9, 9])
    assert small.size == 6
    small.insert([4, 4])
    assert small.size <= 6 and small.match_prefix([4, 4]) == 2
    assert small.match_prefix([5, 6, 9, 9]) == 4  # the newer branch stayed


def test_matches_agree_with_a_brute_force_model_and_stay_fast() -> None:
    rng = random.Random(3)
    cache = RadixCache(10**9)
    held: list[list[int]] = []
    base = [rng.randrange(50) for _ in range(2000)]
    for _ in range(200):
        seq = base[: rng.randrange(2000)] + [rng.randrange(50) for _ in range(rng.randrange(300))]
        probe = seq[: rng.randrange(len(seq) + 1)] + [rng.randrange(50)]

        def common(a: list[int], b: list[int]) -> int:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n

        expected = max((common(h, probe) for h in held), default=0)
        assert cache.match_prefix(probe) == expected
        cache.insert(seq)
        held.append(seq)
    long_prompt = base + [1] * 30_000
    cache.insert(long_prompt)
    start = time.perf_counter()
    assert cache.match_prefix(long_prompt) == len(long_prompt)
    assert time.perf_counter() - start < 0.05  # O(prompt), not O(cache)
