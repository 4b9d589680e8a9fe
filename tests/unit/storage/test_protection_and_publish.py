"""Protected prefixes are refused before any work; publishing is create-only and verified."""

from __future__ import annotations

import json
import logging

import pytest

from include.storage import (
    LocalStore,
    ObjectExistsError,
    ReadOnlyStore,
    StoreError,
    open_store,
    publish_generated_shard,
    split_s3_uri,
    validate_output_location,
)


@pytest.mark.parametrize(
    ("uri", "protected"),
    [
        ("s3://b/completions", ["completions/"]),
        ("s3://b/completions/", ["completions"]),
        ("s3://b/completions/run", ["/completions/"]),
        ("s3://b", ["completions/"]),
        ("s3://b/", ["s3://b/completions"]),
        ("s3://b/x", ["s3://b/x/completions/"]),
        ("s3://b/completions/a/b", ["s3://b/completions"]),
        ("/data/completions", ["completions/"]),
        ("/data/completions/run1", ["completions"]),
        ("/data", ["/data/completions/"]),
        ("/data/completions/run1/", ["/data/completions"]),
    ],
)
def test_equal_inside_and_containing_are_refused(uri: str, protected: list[str]) -> None:
    with pytest.raises(StoreError, match="protected prefix") as err:
        validate_output_location(uri, protected)
    assert str(protected) in str(err.value)


@pytest.mark.parametrize(
    ("uri", "protected"),
    [
        ("s3://b/completions-v2/run", ["completions/"]),
        ("s3://b/runs/completions", ["completions/"]),  # relative = at the bucket root
        ("s3://b/completions", ["s3://other/completions/"]),
        ("/data/completions-v2", ["completions/"]),
        ("/data/runs", ["/data/completions"]),
        ("s3://b/runs", []),
    ],
)
def test_neighbours_are_allowed(uri: str, protected: list[str]) -> None:
    validate_output_location(uri, protected)


def test_bad_locations_and_prefixes_are_refused() -> None:
    for uri in ("s3://", "s3://b/a/../completions", "s3://b/./x"):
        with pytest.raises(StoreError):
            validate_output_location(uri, ["completions/"])
    with pytest.raises(StoreError, match="empty"):
        validate_output_location("s3://b/x", ["/"])
    assert split_s3_uri("s3://b/a/b/") == ("b", "a/b")
    with pytest.raises(StoreError):
        split_s3_uri("s3://b//a")


def test_open_store_refuses_before_creating_anything_and_logs_locations(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "completions" / "run1"
    with pytest.raises(StoreError, match=str(target)):
        open_store(str(target))
    assert not (tmp_path / "completions").exists()
    with caplog.at_level(logging.INFO, logger="include.storage.store"):
        store = open_store(str(tmp_path / "runs" / "r1"), protected_prefixes=["completions/"])
    assert isinstance(store, LocalStore)
    assert f"output location {tmp_path / 'runs' / 'r1'} (protected prefixes: completions/)" in (
        caplog.text
    )


def test_read_only_store_reads_protected_data_but_never_writes(tmp_path) -> None:
    LocalStore(tmp_path / "completions").write_new("a.jsonl", b"x\n")
    store = open_store(str(tmp_path / "completions"), read_only=True)
    assert isinstance(store, ReadOnlyStore)
    assert store.list("") == ["a.jsonl"] and store.read("a.jsonl") == b"x\n"
    with pytest.raises(StoreError, match="read-only"):
        store.write_new("b.jsonl", b"y")


def test_publish_generated_shard_is_create_only_and_records_sha256(tmp_path) -> None:
    store = LocalStore(tmp_path)
    jsonl = b'{"id":"a"}\n'
    result = publish_generated_shard(store, 7, jsonl, {"counts": {"completed": 1}})
    assert result.written == ["generated/shard-00007.jsonl", "generated/shard-00007.manifest.json"]
    manifest = json.loads(store.read("generated/shard-00007.manifest.json"))
    assert manifest == result.manifest
    assert manifest["sha256"] == manifest["files"]["generated/shard-00007.jsonl"]["sha256"]
    assert manifest["bytes"] == len(jsonl)
    again = publish_generated_shard(store, 7, jsonl, {"counts": {"completed": 1}})
    assert again.written == [] and len(again.already_present) == 2
    with pytest.raises(ObjectExistsError):
        publish_generated_shard(store, 7, jsonl, {"counts": {"completed": 2}})
