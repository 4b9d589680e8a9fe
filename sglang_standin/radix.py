"""Model SGLang's radix (prefix) cache: how many of a prompt's tokens it already holds.

SGLang keeps the KV of what it has computed in a radix tree keyed by token ids
(`mem_cache/radix_cache.py`, `RadixCache`): a new request reuses the longest cached prefix of
its prompt (`match_prefix`), a request's prompt enters the tree once prefilled and its prompt
plus output once it finishes (`common.py` `release_kv_cache` -> `RadixCache.checkpoint`,
through the last token whose KV exists, so the final sampled token is not in it), and when the
pool is full the least recently used leaves go first (`evict`). The stand-in keeps only the
token ids, bounded by the KV capacity in tokens; matching and inserting cost O(prompt).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence


class _Node:
    __slots__ = ("key", "children", "parent", "last_access")

    def __init__(self, key: array, parent: _Node | None) -> None:
        self.key = key  # the edge label from the parent
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_access = 0


class RadixCache:
    """Hold token sequences in a radix tree of at most `capacity` tokens (LRU leaf eviction)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        """Drop everything (SGLang's /flush_cache resets its tree the same way)."""
        self.root = _Node(array("q"), None)
        self.size = 0
        # A counter, not a clock: ties cannot happen, and order is all LRU needs.
        self._tick = 0
        self._leaves: set[_Node] = set()

    def match_prefix(self, ids: Sequence[int]) -> int:
        """Return how many leading tokens of `ids` the cache holds; marks them recently used."""
        key = ids if isinstance(ids, array) else array("q", ids)
        self._tick += 1
        node, i, n = self.root, 0, len(key)
        while i < n:
            child = node.children.get(key[i])
            if child is None:
                break
            k = _common_prefix(child.key, key, i)
            child.last_access = self._tick
            i += k
            if k < len(child.key):
                break
            node = child
        return i

    def insert(self, ids: Sequence[int]) -> None:
        """Add `ids` (sharing whatever prefix is already held), then evict down to capacity."""
        key = ids if isinstance(ids, array) else array("q", ids)
        self._tick += 1
        node, i, n = self.root, 0, len(key)
        while i < n:
            child = node.children.get(key[i])
            if child is None:
                break
            k = _common_prefix(child.key, key, i)
            if k < len(child.key):
                child = self._split(child, k)  # the tail keeps its own access time
            child.last_access = self._tick
            i += k
            node = child
        if i < n:
            leaf = _Node(key[i:], node)
            leaf.last_access = self._tick
            node.children[key[i]] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self.size += n - i
        self._evict()

    def _split(self, child: _Node, k: int) -> _Node:
        """Cut `child`'s edge after `k` tokens; return the new inner node holding the head."""
        parent = child.parent
        assert parent is not None
        head = _Node(child.key[:k], parent)
        head.last_access = child.last_access
        parent.children[head.key[0]] = head
        child.key = child.key[k:]
        child.parent = head
        head.children[child.key[0]] = child
        return head

    def _evict(self) -> None:
        if self.size <= self.capacity:
            return
        heap = [(leaf.last_access, id(leaf), leaf) for leaf in self._leaves]
        heapq.heapify(heap)
        while self.size > self.capacity and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self._leaves.discard(leaf)
            self.size -= len(leaf.key)
            if parent is not self.root and not parent.children:
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, id(parent), parent))


def _common_prefix(edge: array, key: array, start: int) -> int:
    n = min(len(edge), len(key) - start)
    if edge[:n] == key[start : start + n]:
        return n
    for j in range(n):
        if edge[j] != key[start + j]:
            return j
    return n
