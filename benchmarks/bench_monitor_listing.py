"""The monitor's listing of one run, before and after delimiter listings (issue 18).

A synthetic run folder as a 500-shard run leaves it mid-way: every shard's journal holds
``--segments`` segments (segments stay after compaction), most shards are published and
tokenized, ``--generating`` are still generating. Per monitor refresh:

* old: every key of the run (``Store.list``), what ``monitor/runs.py`` does today;
* new: one delimiter listing (``Store.list_children``) per output folder (``generated/``,
  ``tokenized/``, ``journal/``, ``report/``) and the segments of the shards without a
  generated manifest only.

Printed: S3 LIST requests (a page holds at most 1,000 entries), entries returned, wall time
and peak Python memory of the listing, in a LocalStore; then the same on an in-process S3
(moto, smaller, ``--s3-shards``) with the LIST requests counted as boto3 sends them, which
checks the count model. The last line is one JSON object with new/old ratios.

    .venv/bin/python -m benchmarks.bench_monitor_listing            # ~1 min
    .venv/bin/python -m benchmarks.bench_monitor_listing --shards 50 --s3-shards 5
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from include.layout import (
    GENERATED_PREFIX,
    JOURNAL_PREFIX,
    REPORT_PREFIX,
    SHARD_MANIFEST_SUFFIX,
    TOKENIZED_PREFIX,
    compacted_keys,
    generated_keys,
    journal_prefix,
    journal_settings_key,
    lease_key,
    shard_id,
    started_key,
    tokenized_keys,
)
from include.storage import LocalStore, S3Store, Store

PAGE = 1000  # entries per LIST response (S3's MaxKeys limit)


def run_keys(shards: int, segments: int, generating: int) -> list[str]:
    """Return every key of the synthetic run: the last ``generating`` shards unpublished."""
    keys = ["prompts/manifest.json", "report/manual__1/report.json"]
    for i in range(shards):
        sid = shard_id(i)
        keys += [f"prompts/{sid}.jsonl", started_key(sid), journal_settings_key(sid),
                 lease_key(journal_prefix(sid), 1)]
        keys += [f"{journal_prefix(sid)}/part-{n:08d}.jsonl" for n in range(segments)]
        if i < shards - generating:
            keys += [*generated_keys(i), *tokenized_keys(i), *compacted_keys(journal_prefix(sid))]
    return keys


def old_refresh(store: Store) -> tuple[int, int]:
    """Every key of the run: (LIST requests, entries returned)."""
    keys = store.list("")
    return max(1, math.ceil(len(keys) / PAGE)), len(keys)


def new_refresh(store: Store) -> tuple[int, int]:
    """Folders one level at a time, segments only where a shard still generates."""
    calls = entries = 0

    def children(prefix: str) -> tuple[list[str], list[str]]:
        nonlocal calls, entries
        keys, subs = store.list_children(prefix)
        calls += max(1, math.ceil((len(keys) + len(subs)) / PAGE))
        entries += len(keys) + len(subs)
        return keys, subs

    children("")  # the run's folders, regenerations/ among them
    generated = {k.split("/")[1].removesuffix(SHARD_MANIFEST_SUFFIX)
                 for k in children(f"{GENERATED_PREFIX}/")[0]
                 if k.endswith(SHARD_MANIFEST_SUFFIX)}
    children(f"{TOKENIZED_PREFIX}/")
    children(f"{REPORT_PREFIX}/")
    _, journals = children(f"{JOURNAL_PREFIX}/")
    for folder in journals:
        if folder.split("/")[1] not in generated:
            children(folder)  # the segments of a shard still generating
    return calls, entries


def measure(store: Store, refresh: Any) -> dict[str, Any]:
    """Return one refresh's LIST requests, entries, wall time and peak Python memory."""
    refresh(store)  # warm the file system cache: both approaches measured warm
    began = time.perf_counter()
    calls, entries = refresh(store)
    wall = time.perf_counter() - began
    tracemalloc.start()
    refresh(store)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"list_calls": calls, "entries": entries, "wall_s": round(wall, 4),
            "peak_mib": round(peak / 2**20, 2)}


def local_store(root: Path, keys: list[str]) -> LocalStore:
    """Write the keys as empty files (not through write_new: its fsync per key is the slow
    part of building 100k files, and the listing cost does not depend on it)."""
    for key in keys:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return LocalStore(root)


def s3_counts(shards: int, segments: int, generating: int) -> dict[str, Any]:
    """The same two refreshes on moto's in-process S3, LIST requests counted as sent."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x",
                              aws_secret_access_key="x")
        client.create_bucket(Bucket="bench")
        for key in run_keys(shards, segments, generating):
            client.put_object(Bucket="bench", Key=f"runs/r/{key}", Body=b"")
        store = S3Store("s3://bench/runs/r", client=client)
        sent: list[int] = []
        client.meta.events.register("before-call.s3.ListObjectsV2",
                                    lambda **kw: sent.append(1))
        out = {}
        for name, refresh in (("old", old_refresh), ("new", new_refresh)):
            sent.clear()
            calls, entries = refresh(store)
            out[name] = {"list_calls_sent": len(sent), "list_calls_modelled": calls,
                         "entries": entries}
    return out


def main() -> None:
    """Build the synthetic run, measure both refreshes, print the figures and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=500)
    parser.add_argument("--segments", type=int, default=200)
    parser.add_argument("--generating", type=int, default=8)
    parser.add_argument("--s3-shards", type=int, default=20,
                        help="shards of the moto S3 check (0: skip it)")
    args = parser.parse_args()
    keys = run_keys(args.shards, args.segments, args.generating)
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        began = time.perf_counter()
        store = local_store(Path(tmp) / "run", keys)
        print(f"synthetic run: {len(keys):,} keys ({args.shards} shards x {args.segments} "
              f"segments, {args.generating} generating), written in "
              f"{time.perf_counter() - began:.1f}s")
        old, new = measure(store, old_refresh), measure(store, new_refresh)
    for name, m in (("old: list every key", old), ("new: list_children", new)):
        print(f"{name:22s} {m['list_calls']:6,} LIST requests {m['entries']:9,} entries "
              f"{m['wall_s']:8.3f}s {m['peak_mib']:8.2f} MiB peak")
    s3 = s3_counts(args.s3_shards, args.segments, args.generating) if args.s3_shards else None
    if s3:
        print(f"moto S3, {args.s3_shards} shards: old {s3['old']['list_calls_sent']} LIST "
              f"requests sent ({s3['old']['list_calls_modelled']} modelled), new "
              f"{s3['new']['list_calls_sent']} ({s3['new']['list_calls_modelled']} modelled)")
    print(json.dumps({
        "shards": args.shards, "segments": args.segments, "generating": args.generating,
        "keys": len(keys), "old": old, "new": new,
        "list_calls_ratio_new_over_old": round(new["list_calls"] / old["list_calls"], 4),
        "entries_ratio_new_over_old": round(new["entries"] / old["entries"], 4),
        "wall_ratio_new_over_old": round(new["wall_s"] / old["wall_s"], 4),
        "peak_memory_ratio_new_over_old": round(new["peak_mib"] / max(old["peak_mib"], 1e-9), 4),
        "s3": s3,
    }))


if __name__ == "__main__":
    main()
