"""write_new_concat on a local store: one create-only object from many, streamed, in order."""

from __future__ import annotations

import hashlib
import os

import pytest

from include.storage import LocalStore, ObjectExistsError, ReadOnlyStore, StoreError
from include.storage.s3_upload import composite_sha256, cut_parts, part_size_for
from tests.fixtures.memory import traced_peak

MiB = 1024 * 1024


def _sources(store: LocalStore) -> tuple[list[str], bytes]:
    parts = [b"first\n", b"", b"second\n" * 3, b"third"]
    keys = [f"pretokenized/shard-{i:05d}.jsonl" for i in range(len(parts))]
    for key, data in zip(keys, parts, strict=True):
        store.write_new(key, data)
    return keys, b"".join(parts)


def test_concat_writes_the_sources_in_order_and_returns_size_and_sha(tmp_path) -> None:
    store = LocalStore(tmp_path)
    keys, whole = _sources(store)
    got = store.write_new_concat("pretokenized.jsonl", keys)
    assert got == (len(whole), hashlib.sha256(whole).hexdigest())
    assert store.read("pretokenized.jsonl") == whole
    # Order is the caller's, not sorted: reversed sources give other bytes.
    rev = store.write_new_concat("reversed.jsonl", keys[::-1])
    assert store.read("reversed.jsonl") == b"".join(store.read(k) for k in keys[::-1])
    assert rev[1] != got[1]
    assert not [p for p in tmp_path.rglob(".tmp-*")]  # no temp file left


def test_a_retry_with_the_same_bytes_is_done_and_other_bytes_are_refused(tmp_path) -> None:
    store = LocalStore(tmp_path)
    keys, whole = _sources(store)
    first = store.write_new_concat("all.jsonl", keys)
    assert store.write_new_concat("all.jsonl", keys) == first  # a retried task
    with pytest.raises(ObjectExistsError, match=r"all\.jsonl already exists.*nothing was over"):
        store.write_new_concat("all.jsonl", keys[:-1])
    assert store.read("all.jsonl") == whole
    # A key written by write_new with the same bytes counts as the same object.
    store.write_new("other.jsonl", whole)
    assert store.write_new_concat("other.jsonl", keys) == first


def test_a_missing_source_is_named_and_nothing_is_created(tmp_path) -> None:
    store = LocalStore(tmp_path)
    keys, _ = _sources(store)
    with pytest.raises(FileNotFoundError, match=r"pretokenized/shard-00009\.jsonl: no such"):
        store.write_new_concat("all.jsonl", [*keys, "pretokenized/shard-00009.jsonl"])
    assert not store.exists("all.jsonl")
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_concat_is_checked_against_protected_prefixes_and_read_only_stores(tmp_path) -> None:
    store = LocalStore(tmp_path)
    keys, _ = _sources(store)
    store.protected = (str(tmp_path / "completions"),)
    with pytest.raises(StoreError, match="protected"):
        store.write_new_concat("completions/all.jsonl", keys)
    with pytest.raises(StoreError, match="opened read-only"):
        ReadOnlyStore(store).write_new_concat("all.jsonl", keys)
    assert not store.exists("completions/all.jsonl") and not store.exists("all.jsonl")


def test_concat_streams_in_bounded_memory(tmp_path) -> None:
    store = LocalStore(tmp_path)
    keys = []
    for i in range(4):  # 48 MiB in all, written without holding it in this process
        (tmp_path / f"s{i}").write_bytes(os.urandom(12 * MiB))
        keys.append(f"s{i}")
    (size, _), peak = traced_peak(lambda: store.write_new_concat("all.bin", keys))
    assert size == 48 * MiB
    assert peak < 20 * MiB, f"peak {peak / MiB:.1f} MiB for a 48 MiB concatenation"


def test_parts_are_cut_from_a_stream_at_the_part_size() -> None:
    chunks = [b"ab", b"cdefg", b"", b"h", b"ijklmnop"]
    assert list(cut_parts(chunks, 3)) == [b"abc", b"def", b"ghi", b"jkl", b"mno", b"p"]
    assert list(cut_parts([b"abcdef"], 3)) == [b"abc", b"def"]
    assert list(cut_parts([], 3)) == []
    assert part_size_for(10 * MiB, 5 * MiB) == 5 * MiB
    assert part_size_for(100_000 * MiB, 5 * MiB) == 10 * MiB  # at most 10,000 parts


def test_the_composite_checksum_is_sha256_of_the_part_digests() -> None:
    import base64

    digests = [hashlib.sha256(p).digest() for p in (b"one", b"two")]
    whole = base64.b64encode(hashlib.sha256(digests[0] + digests[1]).digest()).decode()
    assert composite_sha256(digests) == f"{whole}-2"
