"""The shard lease on a real S3 endpoint (moto_server): conditional puts pick one taker per
generation, renewals are objects, a late publish is refused, a late segment is not read."""

from __future__ import annotations

import threading
import time

import pytest

from include.durability.claims import wait_for_turn
from include.durability.journal import StoreJournal
from include.durability.lease import LeaseLost, check_token, newest, try_take
from include.storage import S3Store
from tests.fixtures.s3 import Bucket, moto_endpoint, s3_bucket  # noqa: F401

pytestmark = pytest.mark.integration
PREFIX = "journal/shard-00000"


def _store(bucket: Bucket) -> S3Store:
    return S3Store(f"{bucket.uri}/runs/r", client=bucket.endpoint.client())


def test_one_taker_wins_each_generation_on_s3(s3_bucket: Bucket) -> None:  # noqa: F811
    store = _store(s3_bucket)
    barrier = threading.Barrier(6)
    results: list = [None] * 6

    def take(i: int) -> None:
        barrier.wait()
        results[i] = try_take(store, PREFIX, 1, f"run-{i}/try", f"run-{i}", ttl_s=0.5)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert newest(store, PREFIX).body["holder"] == winners[0].holder


def test_a_dead_holder_on_s3_expires_and_its_late_write_is_refused(
    s3_bucket: Bucket,  # noqa: F811
) -> None:
    store = _store(s3_bucket)
    live = try_take(store, PREFIX, 1, "run-1/a", "run-1", ttl_s=0.6).start()
    # Renewals every 0.15 s keep it, however long the machine takes to make three.
    deadline = time.monotonic() + 30
    while live.beats < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.beats >= 3 and live.lost() is None
    live.stop()  # it dies without releasing
    taker = wait_for_turn(store, "shard-00000", PREFIX, "run-2", lambda r: True,
                          done=lambda: False, poll_s=0.05, timeout_s=30)
    assert taker is not None and taker.generation == 2
    with pytest.raises(LeaseLost):
        live.confirm()
    with pytest.raises(LeaseLost):
        check_token(store, PREFIX, 1, "shard-00000")
    check_token(store, PREFIX, 2, "shard-00000")  # the new holder's token is current
    taker.release(complete=True)
    assert newest(store, PREFIX).released == {"holder": taker.holder, "complete": True}


def test_a_segment_landing_on_s3_after_the_takeover_is_not_read(
    s3_bucket: Bucket,  # noqa: F811
) -> None:
    """Issue 26.2 on S3: the segments are listed, then the newest generation read; the one a
    paused holder lands after the takeover is in no resume (``fencing``)."""
    store = _store(s3_bucket)
    old = try_take(store, PREFIX, 1, "run-1/a", "run-1", ttl_s=0.3)
    stale = StoreJournal(store, PREFIX, tag="00000001")
    stale.append({"id": "p:0", "status": "completed", "server": "old"})
    stale.flush()
    late = (f"{PREFIX}/part-{time.time_ns():020d}-{stale._writer}-000001.jsonl",
            b'{"id": "p:1", "status": "completed", "server": "old"}\n')
    del old  # paused: never renews
    taker = wait_for_turn(store, "shard-00000", PREFIX, "run-2", lambda r: True,
                          done=lambda: False, poll_s=0.05, timeout_s=10)
    assert taker.generation == 2
    store.write_new(*late)
    assert sorted(StoreJournal(store, PREFIX).load()) == ["p:0"]
    taker.release(complete=False)
