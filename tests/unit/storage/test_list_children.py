"""``list_children``: one folder level, sub-folders as prefixes, never the keys under them."""

from __future__ import annotations

import pytest

from include.storage import LocalStore, open_store

KEYS = ["journal/shard-00000/started", "journal/shard-00000/part-1.jsonl",
        "journal/shard-00000/lease/00000001.json", "journal/shard-00000.settings.json",
        "journal/shard-00001/part-1.jsonl", "journal/shard-00001.compacted.json",
        "generated/shard-00000.manifest.json", "top.json"]


@pytest.fixture
def store(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "run")
    for key in KEYS:
        store.write_new(key, b"x")
    return store


def test_a_folder_lists_its_own_keys_and_its_sub_folders_once(store) -> None:
    assert store.list_children("journal/") == (
        ["journal/shard-00000.settings.json", "journal/shard-00001.compacted.json"],
        ["journal/shard-00000/", "journal/shard-00001/"])
    assert store.list_children("journal") == store.list_children("journal/")
    assert store.list_children("journal/shard-00000") == (
        ["journal/shard-00000/part-1.jsonl", "journal/shard-00000/started"],
        ["journal/shard-00000/lease/"])


def test_the_root_and_a_missing_folder(store) -> None:
    assert store.list_children("") == (["top.json"], ["generated/", "journal/"])
    assert store.list_children("nothing/here") == ([], [])
    assert store.list_children("top.json") == ([], [])  # a key is not a folder


def test_a_write_in_flight_is_not_listed(store, tmp_path) -> None:
    (tmp_path / "run" / "journal" / ".tmp-abc").write_bytes(b"half")
    assert ".tmp-abc" not in " ".join(store.list_children("journal")[0])


def test_a_read_only_store_lists_the_same(store) -> None:
    ro = open_store(store.root, read_only=True)
    assert ro.list_children("journal") == store.list_children("journal")


def test_a_folder_name_that_leaves_the_root_is_refused(store) -> None:
    from include.storage import StoreError

    with pytest.raises(StoreError):
        store.list_children("../elsewhere")
