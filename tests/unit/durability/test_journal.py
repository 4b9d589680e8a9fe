"""The journal: durable lines, one final record per id, torn lines are redone, two forms."""

from __future__ import annotations

import threading
import time

import pytest

from include.durability.journal import FileJournal, StoreJournal
from include.storage import LocalStore, StoreError


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


def test_file_journal_appends_after_a_torn_line_without_gluing(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"id": "a", "status": "completed"}\n{"id": "b", "sta')
    j = FileJournal(path)
    j.append({"id": "c", "status": "completed"})
    j.close()
    assert set(FileJournal(path).load()) == {"a", "c"}


class GatedStore(LocalStore):
    """A store whose writes wait for ``gate`` and record the thread that made them."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.threads: list[int] = []
        self.fail = False

    def write_new(self, key: str, data: bytes) -> bool:
        self.threads.append(threading.get_ident())
        released = self.gate.wait(30)  # a bounded wait: a regression fails instead of hanging
        if self.fail or not released:
            raise StoreError(f"cannot write {key}")
        return super().write_new(key, data)


def _segments(store: LocalStore) -> list[str]:
    return [k for k in store.list("journal/s") if k.endswith(".jsonl")]


def _wait_for(predicate) -> None:
    deadline = time.monotonic() + 30
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_store_journal_writes_off_the_callers_thread_in_order(tmp_path) -> None:
    store = GatedStore(tmp_path)
    j = StoreJournal(store, "journal/s", flush_every=1000, flush_interval_s=0.0)
    for i in range(50):  # returns while the first PUT is held: appends never wait for one
        j.append({"id": str(i), "status": "completed", "n": i})
    j.flush_if_due()
    assert _segments(store) == []
    store.gate.set()
    j.close()
    assert threading.get_ident() not in store.threads
    lines = [line for key in _segments(store) for line in store.read(key).splitlines()]
    assert [int(line.split(b'"n":')[1].rstrip(b"}")) for line in lines] == list(range(50))
    assert len(StoreJournal(store, "journal/s").load()) == 50


def test_store_journal_puts_at_once_when_flush_every_lines_wait(tmp_path) -> None:
    store = GatedStore(tmp_path)
    j = StoreJournal(store, "journal/s", flush_every=3, flush_interval_s=3600)
    j.append({"id": "0", "status": "completed"})  # the first PUT starts at once, held
    _wait_for(lambda: len(store.threads) == 1)
    for i in range(1, 5):
        j.append({"id": str(i), "status": "completed"})
    store.gate.set()
    _wait_for(lambda: len(_segments(store)) == 2)
    # Line 0, then lines 1-4 in one PUT (4 >= flush_every); nothing else is due for an hour.
    assert len(_segments(store)) == 2
    assert len(StoreJournal(store, "journal/s").load()) == 5
    j.append({"id": "5", "status": "completed"})
    assert len(_segments(store)) == 2
    j.close()
    assert len(StoreJournal(store, "journal/s").load()) == 6


def test_store_journal_writes_lines_without_a_flush_call(tmp_path) -> None:
    store = LocalStore(tmp_path)
    j = StoreJournal(store, "journal/s", flush_every=100, flush_interval_s=0.01)
    for i in range(3):
        j.append({"id": str(i), "status": "completed"})
    _wait_for(lambda: len(StoreJournal(store, "journal/s").load()) == 3)
    assert len(StoreJournal(store, "journal/s").load()) == 3
    j.close()


def test_a_failed_store_write_surfaces_on_the_next_call(tmp_path) -> None:
    store = GatedStore(tmp_path)
    store.fail = True
    store.gate.set()
    j = StoreJournal(store, "journal/s", flush_every=100, flush_interval_s=0.0)
    j.append({"id": "a", "status": "completed"})
    with pytest.raises(StoreError, match="cannot write"):
        j.flush()
    with pytest.raises(StoreError):
        j.append({"id": "b", "status": "completed"})


def test_two_store_journal_writers_never_collide(tmp_path) -> None:
    store = LocalStore(tmp_path)
    one = StoreJournal(store, "journal/s")
    two = StoreJournal(store, "journal/s")
    one.append({"id": "a", "status": "completed"})
    two.append({"id": "b", "status": "completed"})
    one.close()
    two.close()
    assert set(StoreJournal(store, "journal/s").load()) == {"a", "b"}
    assert len(_segments(store)) == 2


def test_a_retryable_failure_gives_way_to_a_later_record(make_journal) -> None:
    j = make_journal()
    j.append({"id": "brownout", "status": "failed", "reason": "http_5xx"})
    j.append({"id": "too_long", "status": "failed", "reason": "length_error"})
    j.append({"id": "done", "status": "completed", "content": "first"})
    j.append({"id": "flaky", "status": "failed", "reason": "timeout"})
    j.append({"id": "flaky", "status": "failed", "reason": "queue_full"})
    j.close()
    j = make_journal()
    j.append({"id": "brownout", "status": "completed", "content": "later"})
    j.append({"id": "too_long", "status": "completed", "content": "never"})
    j.append({"id": "done", "status": "failed", "reason": "http_5xx"})
    j.close()
    loaded = make_journal().load()
    assert loaded["brownout"]["content"] == "later"
    assert loaded["too_long"]["status"] == "failed"  # not retryable: final
    assert loaded["done"]["content"] == "first"
    assert loaded["flaky"]["reason"] == "queue_full"  # still retryable: the latest
