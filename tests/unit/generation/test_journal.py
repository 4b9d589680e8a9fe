"""The journal: durable lines, first line per id wins, torn lines are redone, two forms."""

from __future__ import annotations

import pytest

from include.generation.journal import FileJournal, StoreJournal
from include.storage import LocalStore


@pytest.fixture(params=["file", "store"])
def make_journal(request, tmp_path):
    def build():
        if request.param == "file":
            return FileJournal(tmp_path / "j.jsonl")
        return StoreJournal(LocalStore(tmp_path / "store"), "journal/shard-00000",
                            flush_every=2, flush_interval_s=60)
    return build


def test_lines_survive_reopening_and_first_line_per_id_wins(make_journal) -> None:
    j = make_journal()
    j.append({"id": "a", "status": "completed", "content": "first"})
    j.append({"id": "b", "status": "skipped"})
    j.append({"id": "a", "status": "completed", "content": "second"})
    j.close()
    loaded = make_journal().load()
    assert set(loaded) == {"a", "b"}
    assert loaded["a"]["content"] == "first"


def test_file_journal_ignores_a_torn_last_line(tmp_path) -> None:
    j = FileJournal(tmp_path / "j.jsonl")
    j.append({"id": "a", "status": "completed"})
    j.close()
    with open(tmp_path / "j.jsonl", "ab") as fh:
        fh.write(b'{"id": "b", "stat')
    assert set(FileJournal(tmp_path / "j.jsonl").load()) == {"a"}


def test_store_journal_writers_never_collide_and_unflushed_lines_are_not_visible(tmp_path):
    store = LocalStore(tmp_path)
    one = StoreJournal(store, "journal/s", flush_every=100, flush_interval_s=60)
    two = StoreJournal(store, "journal/s", flush_every=100, flush_interval_s=60)
    one.append({"id": "a", "status": "completed"})
    two.append({"id": "b", "status": "completed"})
    assert StoreJournal(store, "journal/s").load() == {}
    one.flush()
    two.flush()
    assert set(StoreJournal(store, "journal/s").load()) == {"a", "b"}
    assert len(store.list("journal/s")) == 2


def test_store_journal_flushes_by_count(tmp_path) -> None:
    store = LocalStore(tmp_path)
    j = StoreJournal(store, "journal/s", flush_every=3, flush_interval_s=60)
    for i in range(7):
        j.append({"id": str(i), "status": "completed"})
    assert len(StoreJournal(store, "journal/s").load()) == 6


def test_file_journal_appends_after_a_torn_line_without_gluing(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"id": "a", "status": "completed"}\n{"id": "b", "sta')
    j = FileJournal(path)
    j.append({"id": "c", "status": "completed"})
    j.close()
    assert set(FileJournal(path).load()) == {"a", "c"}


def test_store_journal_flushes_old_lines_without_new_appends(tmp_path) -> None:
    import time

    store = LocalStore(tmp_path)
    j = StoreJournal(store, "journal/s", flush_every=100, flush_interval_s=0.05)
    j.append({"id": "a", "status": "completed"})
    j.flush_if_due()
    assert StoreJournal(store, "journal/s").load() == {}
    time.sleep(0.06)
    j.flush_if_due()
    assert set(StoreJournal(store, "journal/s").load()) == {"a"}
