"""S3Store against a real S3 endpoint (moto_server): create-only, verified, protected."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from include.storage import (
    ObjectExistsError,
    S3Store,
    StoreError,
    open_store,
    publish_files,
    publish_generated_shard,
)
from tests.fixtures.s3 import Bucket

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _store(bucket: Bucket, prefix: str = "runs/r1", **kwargs: Any) -> S3Store:
    return S3Store(f"{bucket.uri}/{prefix}", client=bucket.endpoint.client(), **kwargs)


def _snapshot(bucket: Bucket, prefix: str) -> dict[str, tuple[bytes, str, Any]]:
    """Return key -> (bytes, ETag, LastModified) of every object under ``prefix``."""
    out = {}
    for page in bucket.client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket.name, Prefix=prefix
    ):
        for obj in page.get("Contents", ()):
            body = bucket.client.get_object(Bucket=bucket.name, Key=obj["Key"])["Body"].read()
            out[obj["Key"]] = (body, obj["ETag"], obj["LastModified"])
    return out


def test_open_store_uses_the_airflow_connection_and_round_trips(s3_bucket: Bucket) -> None:
    store = open_store(f"{s3_bucket.uri}/runs/r1", s3_conn_id=s3_bucket.endpoint.conn_id)
    assert isinstance(store, S3Store) and store.endpoint == s3_bucket.endpoint.url
    assert store.write_new("generated/a.jsonl", b"line\n") is True
    assert store.read("generated/a.jsonl") == b"line\n"
    assert store.exists("generated/a.jsonl") and not store.exists("generated/b.jsonl")
    assert store.uri("generated/a.jsonl") == f"{s3_bucket.uri}/runs/r1/generated/a.jsonl"
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="runs/r1/generated/a.jsonl")
    assert head["Metadata"]["sha256"] == store.stored_sha256("generated/a.jsonl")
    with pytest.raises(FileNotFoundError, match="generated/b.jsonl"):
        store.read("generated/b.jsonl")


def test_seeded_completions_are_untouched_by_a_full_shards_outputs(s3_bucket: Bucket) -> None:
    for i in range(3):
        s3_bucket.client.put_object(
            Bucket=s3_bucket.name, Key=f"completions/part-{i}.jsonl", Body=f"orig {i}\n".encode()
        )
    before = _snapshot(s3_bucket, "completions/")
    store = open_store(f"{s3_bucket.uri}/runs/r1", s3_conn_id=s3_bucket.endpoint.conn_id)
    jsonl = b"".join(json.dumps({"id": f"s:default:{i}"}).encode() + b"\n" for i in range(50))
    publish_generated_shard(store, 0, jsonl, {"counts": {"completed": 50}})
    publish_files(
        store,
        {
            "tokenized/shard-00000.parquet": b"PAR1...",
            "tokenized/shard-00000.conversations.jsonl": b"{}\n",
        },
        "tokenized/shard-00000.manifest.json",
        {"counts": {"written": 50}},
    )
    # Everything landed under the run, nothing under completions/.
    assert store.list("") == [
        "generated/shard-00000.jsonl",
        "generated/shard-00000.manifest.json",
        "tokenized/shard-00000.conversations.jsonl",
        "tokenized/shard-00000.manifest.json",
        "tokenized/shard-00000.parquet",
    ]
    assert _snapshot(s3_bucket, "completions/") == before
    manifest = json.loads(store.read("generated/shard-00000.manifest.json"))
    assert manifest["sha256"] == store.stored_sha256("generated/shard-00000.jsonl")


@pytest.mark.parametrize(
    ("output", "protected"),
    [
        ("{b}/completions", ["completions/"]),  # equal
        ("{b}/completions/", ["completions"]),  # equal, slashes swapped
        ("{b}/completions/run1", ["completions/"]),  # inside
        ("{b}/runs/completions/run1", ["completions/"]),  # inside, at any depth
        ("{b}", ["/completions/"]),  # the bucket root contains it
        ("S3://{n}//runs/../completions/./run1", ["./completions/"]),  # spelled otherwise
        ("{b}/", ["{b}/completions"]),  # containing, full form
        ("{b}/completions/x/run1", ["{b}/completions/"]),  # inside, full form
        ("{b}/data", ["{b}/data/completions"]),  # containing a deeper protected prefix
    ],
)
def test_protected_prefix_misconfigurations_are_refused_before_any_work(
    s3_bucket: Bucket, output: str, protected: list[str]
) -> None:
    output = output.format(b=s3_bucket.uri, n=s3_bucket.name)
    protected = [p.format(b=s3_bucket.uri) for p in protected]
    with pytest.raises(StoreError, match="protected prefix") as err:
        open_store(output, s3_conn_id="no_such_connection", protected_prefixes=protected)
    # Refused before touching S3: the (missing) connection was never even looked up.
    assert "no_such_connection" not in str(err.value)
    assert repr(output) in str(err.value)
    assert s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name).get("KeyCount", 0) == 0


def test_similar_names_and_other_buckets_are_allowed(s3_bucket: Bucket) -> None:
    conn = s3_bucket.endpoint.conn_id
    for output in (f"{s3_bucket.uri}/completions-v2/run1", f"{s3_bucket.uri}/runs/xcompletions"):
        assert open_store(output, s3_conn_id=conn).root == output
    spelled = f"S3://{s3_bucket.name}//runs/./a/../r1/"
    assert open_store(spelled, s3_conn_id=conn).root == f"{s3_bucket.uri}/runs/r1"
    other = open_store(
        f"{s3_bucket.uri}/runs", s3_conn_id=conn, protected_prefixes=["s3://another-bucket/runs/"]
    )
    assert other.root == f"{s3_bucket.uri}/runs"


def test_retried_upload_succeeds_without_rewriting(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket)
    jsonl = b'{"id": "a"}\n' * 100
    first = publish_generated_shard(store, 3, jsonl, {"counts": {"completed": 100}})
    assert first.written == ["generated/shard-00003.jsonl", "generated/shard-00003.manifest.json"]
    before = _snapshot(s3_bucket, "runs/r1/")
    time.sleep(1.1)  # LastModified has one-second resolution
    again = publish_generated_shard(_store(s3_bucket), 3, jsonl, {"counts": {"completed": 100}})
    assert again.written == [] and len(again.already_present) == 2
    assert again.manifest == first.manifest
    assert _snapshot(s3_bucket, "runs/r1/") == before
    with pytest.raises(ObjectExistsError, match=r"s3://.*/runs/r1/generated/shard-00003.jsonl"):
        publish_generated_shard(store, 3, jsonl + b"more\n", {"counts": {"completed": 101}})
    assert _snapshot(s3_bucket, "runs/r1/") == before  # nor the manifest, after the refusal


# Single puts only: moto checks If-None-Match and completes a multipart upload in two steps
# without a lock, so racing multipart completions can both "win" there (real S3 is atomic;
# our post-upload verification then reports the overwritten loser as corrupted).
@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_writers_of_one_key_exactly_one_wins(s3_bucket: Bucket, writers: int) -> None:
    size = 1000
    outcomes: list[str] = []
    barrier = threading.Barrier(writers)

    def write(i: int) -> None:
        store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
        data = bytes([65 + i]) * size
        barrier.wait()
        try:
            store.write_new("generated/shard-00000.jsonl", data)
            outcomes.append("won")
        except ObjectExistsError as exc:
            assert "s3://" in str(exc) and "nothing was overwritten" in str(exc)
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * (writers - 1) + ["won"]
    body = _store(s3_bucket).read("generated/shard-00000.jsonl")
    assert len(body) == size and len(set(body)) == 1


def test_multipart_upload_with_a_small_threshold(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket, multipart_threshold=MiB, part_size=5 * MiB)
    data = os.urandom(11 * MiB + 123)
    assert store.write_new("big.bin", data) is True
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="runs/r1/big.bin")
    assert head["ETag"].endswith('-3"')  # three parts: 5 + 5 + 1 MiB
    assert store.read("big.bin") == data
    assert store.write_new("big.bin", data) is False
    with pytest.raises(ObjectExistsError, match="big.bin"):
        store.write_new("big.bin", data[:-1] + b"x")
    assert store.read("big.bin") == data
    uploads = s3_bucket.client.list_multipart_uploads(Bucket=s3_bucket.name)
    assert not uploads.get("Uploads")  # nothing left half-uploaded


def test_listing_is_paginated_and_folder_scoped(s3_bucket: Bucket) -> None:
    store = _store(s3_bucket)
    keys = [f"journal/shard-00000/part-{i:05d}.jsonl" for i in range(7)]
    for key in keys + ["journal/shard-000001/part-00000.jsonl", "journalx"]:
        store.write_new(key, b"x")
    assert list(store.iter_keys("journal/shard-00000", page_size=2)) == keys
    assert store.list("journal/shard-00000/") == keys
    assert list(store.iter_keys("journal/shard-00000", start_after=keys[4])) == keys[5:]
    assert len(store.list("journal")) == 8 and len(store.list("")) == 9


def test_wrong_credentials_and_missing_bucket_give_clear_errors(s3_bucket: Bucket) -> None:
    url = s3_bucket.endpoint.url
    bad = S3Store(f"{s3_bucket.uri}/runs", client=s3_bucket.endpoint.client("AKIAWRONG", "nope"))
    with pytest.raises(StoreError) as err:
        bad.check_access()
    message = str(err.value)
    assert url in message and s3_bucket.name in message and "credentials" in message
    with pytest.raises(StoreError, match="credentials"):
        bad.write_new("a", b"x")
    missing = S3Store("s3://no-such-bucket-here/runs", client=s3_bucket.endpoint.client())
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist at endpoint"):
        missing.check_access()
    with pytest.raises(StoreError, match="does not exist"):
        missing.write_new("a", b"x")


def test_wrong_credentials_in_the_airflow_connection(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {"endpoint_url": s3_bucket.endpoint.url, "region_name": "us-east-1"}
    conn = json.dumps({"conn_type": "aws", "login": "AKIAWRONG", "password": "x", "extra": extra})
    monkeypatch.setenv("AIRFLOW_CONN_REGEN_BAD_S3", conn)
    with pytest.raises(StoreError, match=r"refused the credentials.*'regen_bad_s3'"):
        open_store(f"{s3_bucket.uri}/runs/r1", s3_conn_id="regen_bad_s3")


def test_every_key_written_to_s3_is_checked_against_relative_prefixes(s3_bucket: Bucket) -> None:
    store = open_store(f"{s3_bucket.uri}/runs/r1", s3_conn_id=s3_bucket.endpoint.conn_id,
                       protected_prefixes=["prompts/"])
    store.write_new("generated/a.jsonl", b"x\n")
    with pytest.raises(StoreError, match="is inside protected prefix 'prompts/'"):
        store.write_new("prompts/shard-00000.jsonl", b"x\n")
    assert _snapshot(s3_bucket, "runs/r1/prompts/") == {}
