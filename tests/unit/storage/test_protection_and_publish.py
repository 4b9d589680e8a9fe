"""Protected prefixes are refused before any work; publishing is create-only and verified.

The location rule itself is tested in test_locations.py.
"""

from __future__ import annotations

import json
import logging

import pytest

from include.storage import (
    LocalStore,
    ObjectExistsError,
    ReadOnlyStore,
    StoreError,
    check_readable,
    open_readable,
    open_store,
    publish_generated_shard,
)


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


def test_open_store_writes_where_it_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("runs//a/./b/../r1/", protected_prefixes=["completions/"])
    assert store.root == str(tmp_path / "runs" / "a" / "r1")
    store.write_new("x.json", b"{}")
    assert (tmp_path / "runs" / "a" / "r1" / "x.json").read_bytes() == b"{}"
    with pytest.raises(StoreError, match="not a supported scheme"):
        open_store("S4://b/runs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no 'S4:' directory


def test_a_symbolic_link_into_protected_data_is_refused(tmp_path) -> None:
    (tmp_path / "completions").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "completions")
    with pytest.raises(StoreError, match="symbolic link") as err:
        open_store(str(tmp_path / "link" / "run"))
    assert str(tmp_path / "completions" / "run") in str(err.value)
    assert list((tmp_path / "completions").iterdir()) == []


def test_every_key_written_is_checked_against_relative_prefixes(tmp_path) -> None:
    # A location's check cannot see that 'prompts/' will match a folder below it; a write can.
    store = open_store(str(tmp_path / "run"), protected_prefixes=["prompts/"])
    store.write_new("generated/a.jsonl", b"x\n")
    with pytest.raises(StoreError, match="is inside protected prefix 'prompts/'"):
        store.write_new("prompts/shard-00000.jsonl", b"x\n")
    assert not (tmp_path / "run" / "prompts").exists()
    assert LocalStore(tmp_path / "run").write_new("prompts/a", b"x")  # only open_store guards


def test_read_only_store_reads_protected_data_but_never_writes(tmp_path) -> None:
    LocalStore(tmp_path / "completions").write_new("a.jsonl", b"x\n")
    store = open_store(str(tmp_path / "completions"), read_only=True)
    assert isinstance(store, ReadOnlyStore)
    assert store.list("") == ["a.jsonl"] and store.read("a.jsonl") == b"x\n"
    with pytest.raises(StoreError, match="read-only"):
        store.write_new("b.jsonl", b"y")


def test_open_readable_gives_a_file_or_a_folder_and_check_readable_finds_records(tmp_path):
    folder = tmp_path / "completions"
    LocalStore(folder).write_new("part-0.jsonl", b'{"messages": []}\n')
    LocalStore(folder).write_new("sub/part-1.json", b"{}\n")
    store, name = open_readable(str(folder))
    assert isinstance(store, ReadOnlyStore) and store.root == str(tmp_path)
    assert store.list(name) == ["completions/part-0.jsonl", "completions/sub/part-1.json"]
    store, name = open_readable(str(folder / "part-0.jsonl") + "/")
    assert store.list(name) == ["part-0.jsonl"]
    check_readable(str(folder))
    check_readable(str(folder / "sub" / "part-1.json"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    for missing in (tmp_path / "nowhere", tmp_path / "notes"):
        with pytest.raises(StoreError, match="does not exist or holds no .jsonl/.json") as err:
            check_readable(str(missing))
        assert repr(str(missing)) in str(err.value)


def test_check_readable_names_a_file_it_cannot_read(tmp_path, monkeypatch) -> None:
    LocalStore(tmp_path).write_new("part-0.jsonl", b"{}\n")

    def refuse(path, *args, **kwargs):  # the tests run as root, whom chmod does not stop
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr("include.storage.store.open", refuse, raising=False)
    with pytest.raises(StoreError, match="cannot read .*part-0.jsonl.*Permission denied"):
        check_readable(str(tmp_path))


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
