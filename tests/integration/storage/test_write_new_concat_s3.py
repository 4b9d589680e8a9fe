"""write_new_concat on S3 (moto_server): one PUT when small, a conditional multipart when large."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from include.storage import ObjectExistsError, S3Store
from tests.fixtures.memory import traced_peak
from tests.fixtures.s3 import Bucket

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _store(bucket: Bucket, **kwargs: Any) -> S3Store:
    return S3Store(f"{bucket.uri}/runs/r1", client=bucket.endpoint.client(), **kwargs)


def _calls(store: S3Store) -> list[str]:
    """Record the name of every S3 operation ``store`` sends."""
    seen: list[str] = []
    store.client.meta.events.register(
        "before-call.s3", lambda model, **_: seen.append(model.name))
    return seen


def _write_sources(store: S3Store, sizes: list[int]) -> tuple[list[str], bytes]:
    keys, blobs = [], []
    for i, size in enumerate(sizes):
        blob = os.urandom(size)
        store.write_new(f"pretokenized/shard-{i:05d}.jsonl", blob)
        keys.append(f"pretokenized/shard-{i:05d}.jsonl")
        blobs.append(blob)
    return keys, b"".join(blobs)


def test_small_concatenations_are_one_conditional_put(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket)
    keys, whole = _write_sources(store, [10, 0, 2000])
    calls = _calls(store)
    got = store.write_new_concat("pretokenized.jsonl", keys)
    assert got == (len(whole), hashlib.sha256(whole).hexdigest())
    assert store.read("pretokenized.jsonl") == whole
    assert calls.count("PutObject") == 1 and "CreateMultipartUpload" not in calls
    assert store.write_new_concat("pretokenized.jsonl", keys) == got  # a retried task
    with pytest.raises(ObjectExistsError, match="pretokenized.jsonl already exists"):
        store.write_new_concat("pretokenized.jsonl", keys[:1])


def test_large_concatenations_go_up_in_parts_completed_create_only(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
    keys, whole = _write_sources(store, [3 * MiB, 4 * MiB + 7, 4 * MiB])  # parts 5, 5, 1 MiB
    calls = _calls(store)
    got = store.write_new_concat("pretokenized.jsonl", keys)
    assert got == (len(whole), hashlib.sha256(whole).hexdigest())
    assert store.read("pretokenized.jsonl") == whole
    assert calls.count("UploadPart") == 3 and calls.count("CompleteMultipartUpload") == 1
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="runs/r1/pretokenized.jsonl")
    assert head["ETag"].endswith('-3"')
    # A retried task compares what is there with the sources, and uploads nothing.
    calls.clear()
    assert store.write_new_concat("pretokenized.jsonl", keys) == got
    assert not {"PutObject", "CreateMultipartUpload", "UploadPart"} & set(calls)
    with pytest.raises(ObjectExistsError, match="nothing was overwritten"):
        store.write_new_concat("pretokenized.jsonl", keys[::-1])
    assert store.read("pretokenized.jsonl") == whole
    assert not s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")


@pytest.mark.parametrize("write", ["write_new_concat", "write_new"])
def test_the_completion_carries_the_condition(s3_bucket: Bucket, write: str) -> None:
    """A key created while the parts went up is not replaced by the completion."""
    store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
    keys, whole = _write_sources(store, [6 * MiB])
    rival = _store(s3_bucket)

    def create_first(**_: Any) -> None:
        rival.write_new("all.bin", b"the rival's bytes")

    store.client.meta.events.register_first(
        "before-call.s3.CompleteMultipartUpload", create_first)
    with pytest.raises(ObjectExistsError, match="all.bin already exists"):
        if write == "write_new":
            store.write_new("all.bin", whole)
        else:
            store.write_new_concat("all.bin", keys)
    assert rival.read("all.bin") == b"the rival's bytes"
    assert not s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")


def test_a_missing_source_is_named_and_nothing_is_created(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
    keys, _ = _write_sources(store, [2 * MiB])
    for threshold in (MiB, 64 * MiB):
        store.multipart_threshold = threshold
        with pytest.raises(FileNotFoundError, match=r"runs/r1/pretokenized/gone\.jsonl: no such"):
            store.write_new_concat("all.jsonl", [*keys, "pretokenized/gone.jsonl"])
        assert not store.exists("all.jsonl")


def test_large_concatenations_stream_in_bounded_memory(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
    keys = []
    for i in range(4):
        store.write_new(f"s{i}", os.urandom(12 * MiB))
        keys.append(f"s{i}")
    (size, _), peak = traced_peak(lambda: store.write_new_concat("all.bin", keys))
    assert size == 48 * MiB
    assert peak < 24 * MiB, f"peak {peak / MiB:.1f} MiB for a 48 MiB concatenation"
