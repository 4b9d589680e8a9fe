"""Shard cutting: the quota sample, the seeded shuffle, the shards written and read back.

Quotas are applied after dedupe by a seeded sample per source, so a quota counts distinct
prompts. The kept prompts are then shuffled with the seed (so each shard mixes sources and
lengths) and cut into shards of ``shard_size``, named by ``include/layout.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
from array import array
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from include.layout import shard_id, shard_index, shard_key
from include.prompts.dedupe import Kept
from include.prompts.errors import PrepareError
from include.prompts.funnel import SourceFunnel
from include.settings import SourceSettings
from include.storage import Store, sha256_hex

log = logging.getLogger(__name__)


def apply_quota(
    source: SourceSettings, funnel: SourceFunnel, available: Sequence[int], seed: int
) -> Sequence[int]:
    """Return the indices of ``available`` kept prompts the source's quota selects (a seeded
    sample; all of them without a quota)."""
    if source.quota is None or source.quota >= len(available):
        return available
    rng = random.Random(f"{seed}:{source.name}")
    # sample draws the same positions from a range as from a list of the same length.
    chosen = sorted(rng.sample(available, source.quota))
    dropped = len(available) - source.quota
    funnel.dropped["over_quota"] += dropped
    funnel.kept -= dropped
    return chosen


def shuffled_order(selected: list[Sequence[int]], seed: int) -> array:
    """Return every selected prompt as ``source << 32 | kept index``, shuffled with the seed.

    One packed int each: an array of 8-byte ints instead of a list of tuples; shuffle only
    swaps items, so the permutation is the same.
    """
    order = array("q")
    for si, chosen in enumerate(selected):
        base = si << 32
        order.extend(
            range(base, base + len(chosen))
            if isinstance(chosen, range)
            else (base | i for i in chosen)
        )
    random.Random(seed).shuffle(order)
    return order


def plan_shards(total: int, shard_size: int) -> int:
    """Return the shard count for ``total`` prompts (any count: ``include/prompts/plan.py``
    checks how many one run maps)."""
    return math.ceil(total / shard_size) if total else 0


def write_shards(
    store: Store, kept: list[Kept], order: array, size: int, n_shards: int
) -> list[dict[str, Any]]:
    """Write the shards in ``order``; return their manifest entries.

    Each shard is stored in a background thread while the next one is read from the
    candidate files and hashed: both sides release the GIL for their long parts (writing and
    fsync; reading and hashing). Lines are read with ``pread``, not through ``mmap``: mapped
    pages would count in the process's resident memory, up to the size of all candidates.
    """
    fds = [os.open(k.path, os.O_RDONLY) for k in kept]
    # Where each prompt in ``order`` lies (file, start, length), found for all at once.
    first = np.cumsum([0] + [len(k.starts) for k in kept])
    codes = np.frombuffer(order, dtype=np.int64)
    flat = first[codes >> 32] + (codes & 0xFFFFFFFF)
    line_file = np.repeat(np.arange(len(kept)), np.diff(first))[flat]
    line_start = np.concatenate([k.starts for k in kept] + [_NO_INTS])[flat]
    line_length = np.concatenate([k.lengths for k in kept] + [_NO_INTS])[flat]
    del codes, flat
    failed = threading.Event()  # as in a plain loop, no shard is written after one failed
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare-shards") as pool:
            writes: list[Future[dict[str, Any]]] = []
            for n in range(n_shards):
                cut = slice(n * size, (n + 1) * size)
                lines = [
                    os.pread(fds[f], length, s)
                    for f, s, length in zip(
                        line_file[cut].tolist(),
                        line_start[cut].tolist(),
                        line_length[cut].tolist(),
                        strict=True,
                    )
                ]
                if sum(map(len, lines)) != int(line_length[cut].sum()):  # never seen locally
                    raise PrepareError("a spool file was cut short; nothing written")
                if n >= 2:  # at most two shards in memory besides the one being cut
                    writes[n - 2].result()
                data = b"".join(lines)
                entry = {
                    "shard_id": shard_id(n),
                    "key": shard_key(n),
                    "count": len(lines),
                    "sha256": sha256_hex(data),  # here: the thread is the slower side
                    "bytes": len(data),
                }
                writes.append(pool.submit(_write_shard, store, n, data, entry, failed))
            return [w.result() for w in writes]
    finally:
        for fd in fds:
            os.close(fd)


def _write_shard(
    store: Store, n: int, data: bytes, entry: dict[str, Any], failed: threading.Event
) -> dict[str, Any]:
    if failed.is_set():
        raise PrepareError(f"{shard_key(n)} not written: an earlier shard failed")
    try:
        created = store.write_new(shard_key(n), data)
    except BaseException:
        failed.set()
        raise
    if not created:
        log.info("%s already written with identical content; kept", shard_key(n))
    return entry


_NO_INTS = np.empty(0, dtype=np.int64)


def read_shard(store: Store, index: int) -> list[dict[str, Any]]:
    """Return the prompt records of shard ``index``."""
    return [json.loads(line) for line in store.read(shard_key(index)).splitlines() if line]


def read_shard_by_id(store: Store, shard: str) -> list[dict[str, Any]]:
    """Return the prompt records of the shard named ``shard`` (e.g. ``shard-00042``)."""
    return read_shard(store, shard_index(shard))
