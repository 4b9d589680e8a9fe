"""One run generates a shard at a time: the first to take the lease goes, the others wait."""

from __future__ import annotations

import threading
import time

import pytest

from include.durability.claims import LeaseBusy, wait_for_turn
from include.durability.lease import newest
from include.storage import LocalStore

PREFIX = "journal/shard-00005"
SHARD = "shard-00005"


def _turn(store, run_id, is_live, done=lambda: False, **kw):
    kw.setdefault("poll_s", 0.02)
    kw.setdefault("ttl_s", 0.4)
    return wait_for_turn(store, SHARD, PREFIX, run_id, is_live, done, **kw)


def _in_thread(fn):
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", fn()), daemon=True)
    thread.start()
    return thread, out


def test_the_first_taker_goes_first_and_an_ended_run_blocks_nobody(tmp_path) -> None:
    store = LocalStore(tmp_path)
    live = {"manual__first", "manual__backfill"}
    first = _turn(store, "manual__first", live.__contains__)
    assert first is not None and first.generation == 1
    with pytest.raises(LeaseBusy, match="still held by manual__first/"):
        _turn(store, "manual__backfill", live.__contains__, timeout_s=0.2)
    # It generated every prompt; its upload is still to come while its run is live.
    first.release(complete=True)
    with pytest.raises(LeaseBusy):
        _turn(store, "manual__backfill", live.__contains__, timeout_s=0.2)
    live.discard("manual__first")  # it ended (success or failure): the backfill goes on
    backfill = _turn(store, "manual__backfill", live.__contains__, timeout_s=1.0)
    assert backfill is not None and backfill.generation == 2
    backfill.release(complete=False)


def test_a_retry_takes_over_its_own_runs_finished_generation(tmp_path) -> None:
    store = LocalStore(tmp_path)
    first_try = _turn(store, "run-b", lambda r: True)
    first_try.release(complete=True)
    # The same run's next try (a cleared task) need not wait for its own upload.
    retry = _turn(store, "run-b", lambda r: True, timeout_s=1.0)
    assert retry.generation == 2 and retry.holder != first_try.holder
    retry.release(complete=False)
    # Released unfinished: anyone takes the next generation at once.
    other = _turn(store, "run-c", lambda r: True, timeout_s=1.0)
    assert other.generation == 3
    other.release(complete=True)
    assert newest(store, PREFIX).released == {"holder": other.holder, "complete": True}


def test_a_waiting_run_starts_when_the_first_ends_or_finds_the_shard_done(tmp_path) -> None:
    store = LocalStore(tmp_path)
    first = _turn(store, "first", lambda r: True)
    threading.Timer(0.3, first.release, kwargs={"complete": False}).start()
    began = time.monotonic()
    second = _turn(store, "second", lambda r: True)
    assert time.monotonic() - began >= 0.25  # it waited for the first try to end
    assert second.generation == 2
    second.release(complete=True)  # the second run generated it; its upload is to come
    done = threading.Event()
    threading.Timer(0.2, done.set).start()
    assert _turn(store, "third", lambda r: True, done=done.is_set) is None
    assert newest(store, PREFIX).generation == 2  # finding it done took nothing


def test_a_renewed_lease_holds_waiters_for_many_ttls(tmp_path) -> None:
    store = LocalStore(tmp_path)
    # A TTL long enough that a loaded machine still renews in time (a renewal every TTL/4).
    holder = _turn(store, "first", lambda r: True, ttl_s=1.5)
    thread, out = _in_thread(lambda: _turn(store, "second", lambda r: True, ttl_s=1.5))
    # Three TTLs at least, however slow the machine: the holder's heartbeat keeps it.
    began = time.monotonic()
    while (holder.beats < 12 or time.monotonic() - began < 4.5) and time.monotonic() - began < 60:
        time.sleep(0.05)
    assert thread.is_alive() and "result" not in out
    assert holder.beats >= 12 and holder.lost() is None
    holder.release(complete=False)
    thread.join(30)
    assert out["result"].generation == 2
    out["result"].release(complete=False)
