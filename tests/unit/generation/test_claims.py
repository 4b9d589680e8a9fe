"""One run generates a shard at a time; the earliest live claim goes first."""

from __future__ import annotations

import threading
import time

from include.generation.claims import claim, runs_ahead, wait_for_turn
from include.storage import LocalStore

PREFIX = "journal/shard-00005"


def test_the_earliest_live_claim_goes_first_and_ended_runs_block_nobody(tmp_path) -> None:
    store = LocalStore(tmp_path)
    claim(store, PREFIX, "manual__first", now=100.0)
    claim(store, PREFIX, "manual__backfill", now=200.0)
    live = {"manual__first", "manual__backfill"}
    assert runs_ahead(store, PREFIX, "manual__backfill", live.__contains__) == ["manual__first"]
    assert runs_ahead(store, PREFIX, "manual__first", live.__contains__) == []
    live.discard("manual__first")  # it ended (success or failure): the backfill goes on
    assert runs_ahead(store, PREFIX, "manual__backfill", live.__contains__) == []


def test_a_retry_keeps_its_place_and_ties_break_by_run_id(tmp_path) -> None:
    store = LocalStore(tmp_path)
    claim(store, PREFIX, "b", now=100.0)
    claim(store, PREFIX, "a", now=100.0)
    claim(store, PREFIX, "b", now=999.0)  # the retry of run b: still claimed at 100
    assert runs_ahead(store, PREFIX, "b", lambda r: True) == ["a"]
    assert runs_ahead(store, PREFIX, "a", lambda r: True) == []


def test_a_waiting_run_starts_when_the_first_ends_or_finds_the_shard_done(tmp_path) -> None:
    store = LocalStore(tmp_path)
    claim(store, PREFIX, "first", now=1.0)
    live = {"first"}
    ended = threading.Timer(0.3, lambda: live.discard("first"))
    ended.start()
    began = time.monotonic()
    assert wait_for_turn(store, "shard-00005", PREFIX, "second", live.__contains__,
                         done=lambda: False, poll_s=0.05) is False
    assert time.monotonic() - began >= 0.25  # it waited for the first run to end
    live.add("first")
    done = threading.Event()
    threading.Timer(0.2, done.set).start()
    assert wait_for_turn(store, "shard-00005", PREFIX, "second", live.__contains__,
                         done=done.is_set, poll_s=0.05) is True
