"""The local store is create-only: identical rewrites succeed, different ones never land."""

from __future__ import annotations

import threading

import pytest

from include.storage import LocalStore, ObjectExistsError, StoreError


def test_write_new_then_identical_rewrite_is_done_and_different_is_refused(tmp_path) -> None:
    store = LocalStore(tmp_path)
    assert store.write_new("a/b.txt", b"one") is True
    assert store.write_new("a/b.txt", b"one") is False
    with pytest.raises(ObjectExistsError, match="nothing was overwritten"):
        store.write_new("a/b.txt", b"two")
    assert store.read("a/b.txt") == b"one"
    assert store.list("a") == ["a/b.txt"] and store.list("") == ["a/b.txt"]


def test_keys_cannot_escape_the_root(tmp_path) -> None:
    store = LocalStore(tmp_path / "root")
    for key in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(StoreError):
            store.write_new(key, b"x")


def test_concurrent_writers_of_one_key_exactly_one_wins(tmp_path) -> None:
    store = LocalStore(tmp_path)
    outcomes: list[str] = []

    def write(i: int) -> None:
        try:
            store.write_new("k", f"writer-{i}".encode())
            outcomes.append("won")
        except ObjectExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and outcomes.count("refused") == 7
    assert store.read("k").startswith(b"writer-")
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no temp files left behind


def test_iter_lines_streams_and_bounds_a_line(tmp_path, monkeypatch) -> None:
    import include.storage.base as base
    from include.storage import LocalStore, StoreError

    store = LocalStore(tmp_path)
    store.write_new("a.jsonl", b"one\ntwo\n\nthree")
    assert list(store.iter_lines("a.jsonl")) == [b"one", b"two", b"", b"three"]
    monkeypatch.setattr(base, "MAX_LINE_BYTES", 8)
    store.write_new("b.jsonl", b"short\n" + b"x" * 20 + b"\n")
    with pytest.raises(StoreError, match="a line longer than 8 bytes"):
        list(store.iter_lines("b.jsonl"))
