"""A staggered shard (``generation/shard.py``) starts when its leader reaches its fraction,
and never waits long for a leader that is not running or has stalled."""

from __future__ import annotations

import json
import threading
import time

import pytest

from include.generation.shard import wait_for_progress
from include.layout import MANIFEST_KEY, journal_prefix, started_key
from include.pipeline.prepare_prompts import plan_run
from include.settings import RunSettings
from include.storage import LocalStore
from tests.fixtures.settings import run_settings


@pytest.fixture
def settings(tmp_path) -> RunSettings:
    return run_settings({"run_name": "r", "shard_size": 60}, output_root=str(tmp_path))


def test_a_staggered_shard_starts_when_the_leader_reaches_its_fraction(settings) -> None:
    plan = plan_run(settings, "run-1", 2)
    store = LocalStore(settings.run_uri)
    leader = plan[0]["shard_id"]
    size = json.loads(store.read(MANIFEST_KEY))["shards"][0]["count"]
    started = threading.Event()

    def follower() -> None:
        wait_for_progress(store, store, plan[1]["shard_id"], leader, 0.5, poll_s=0.05)
        started.set()

    store.write_new(started_key(leader), b"")
    threading.Thread(target=follower, daemon=True).start()
    lines = [json.dumps({"id": f"x{i}", "status": "completed"}) for i in range(size // 2 - 1)]
    store.write_new(f"{journal_prefix(leader)}/part-1.jsonl", ("\n".join(lines) + "\n").encode())
    time.sleep(0.3)
    assert not started.is_set()  # one prompt short of half
    store.write_new(
        f"{journal_prefix(leader)}/part-2.jsonl", b'{"id": "last", "status": "completed"}\n'
    )
    assert started.wait(5)


def test_a_follower_never_waits_long_for_a_leader_that_is_not_running(settings) -> None:
    plan = plan_run(settings, "run-1", 2)
    store = LocalStore(settings.run_uri)
    leader, follower = plan[0]["shard_id"], plan[1]["shard_id"]
    t0 = time.monotonic()  # not started (a one-slot executor runs the follower first)
    wait_for_progress(store, store, follower, leader, 0.5, start_grace_s=0.3, poll_s=0.05)
    assert time.monotonic() - t0 < 3
    store.write_new(started_key(leader), b"")  # started, then stalled
    t0 = time.monotonic()
    wait_for_progress(store, store, follower, leader, 0.5, stall_s=0.3, poll_s=0.05)
    assert time.monotonic() - t0 < 3
