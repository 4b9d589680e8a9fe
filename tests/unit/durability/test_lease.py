"""Issue 18, one writer per shard: each way two writers got in, closed by the shard lease."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import types

import pytest

from include.durability import lease
from include.durability.claims import LeaseBusy, wait_for_turn
from include.durability.journal import StoreJournal
from include.durability.lease import LeaseLost, newest, try_take
from include.generation.shard import publish_shard
from include.layout import beat_key, journal_prefix, lease_key, output_keys, shard_key
from include.pipeline.airflow_state import airflow_run_is_live
from include.prompts.encoding import encode_record
from include.storage import LocalStore

SHARD = "shard-00000"
PREFIX = journal_prefix(SHARD)


def _turn(store, run_id, is_live=lambda r: True, **kw):
    kw.setdefault("poll_s", 0.02)
    kw.setdefault("ttl_s", 0.4)
    return wait_for_turn(store, SHARD, PREFIX, run_id, is_live, lambda: False, **kw)


def _in_thread(fn, name="waiter"):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, out


def test_two_claimants_with_skewed_clocks_never_both_hold_the_shard(tmp_path,
                                                                     monkeypatch) -> None:
    """Before: a claimant whose clock ran 50 ms behind stamped an earlier claim than the
    claimant already generating, and both started. Now no decision reads a wall clock."""
    store = LocalStore(tmp_path)
    real = time.time
    skew = {"ahead": 0.05, "behind": -0.05, "far-behind": -3600.0}
    monkeypatch.setattr(time, "time",
                        lambda: real() + skew.get(threading.current_thread().name, 0.0))
    threads = [_in_thread(lambda: _turn(store, "run-a"), name="ahead"),
               _in_thread(lambda: _turn(store, "run-b"), name="behind"),
               _in_thread(lambda: _turn(store, "run-c"), name="far-behind")]
    time.sleep(0.6)  # longer than the TTL: a waiter must not mistake a live holder for dead
    holders = [out["result"] for _, out in threads if "result" in out]
    assert len(holders) == 1, "exactly one claimant may generate"
    assert holders[0].generation == 1 and holders[0].lost() is None
    holders[0].release(complete=False)  # the next one goes, then the last
    for _ in range(2):
        deadline = time.monotonic() + 2
        while len([o for _, o in threads if "result" in o]) == len(holders):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        new = [o["result"] for _, o in threads if "result" in o and o["result"] not in holders]
        assert len(new) == 1
        holders += new
        new[0].release(complete=False)
    assert [h.generation for h in holders] == [1, 2, 3]


def test_create_only_lets_one_taker_win_each_generation(tmp_path) -> None:
    store = LocalStore(tmp_path)
    barrier = threading.Barrier(8)

    def take(i):
        barrier.wait()
        return try_take(store, PREFIX, 1, f"holder-{i}", "run")

    results = [None] * 8
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, take(i)))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert json.loads(store.read(lease_key(PREFIX, 1)))["holder"] == winners[0].holder


def test_a_zombie_try_and_its_retry_never_both_generate(tmp_path) -> None:
    """Before: two tries of one run shared one claim and never waited for each other."""
    store = LocalStore(tmp_path)
    zombie = _turn(store, "run-1", ttl_s=0.4)  # Airflow gave up on it; it still runs
    journal = StoreJournal(store, PREFIX, fence=zombie.check, tag="00000001")
    journal.append({"id": "p:0", "status": "skipped", "reason": "prompt_too_long"})
    journal.flush()
    thread, out = _in_thread(lambda: _turn(store, "run-1"))
    time.sleep(1.0)  # 2.5 TTLs: the zombie renews, so its retry waits
    assert "result" not in out and thread.is_alive()
    zombie.stop()  # the zombie hangs (no renewal, no release): expired after its TTL
    thread.join(3)
    retry = out["result"]
    assert retry.generation == 2
    # The zombie wakes up: it has lost the lease and writes nothing more.
    with pytest.raises(LeaseLost, match="lease generation 1 is lost"):
        zombie.confirm()
    with pytest.raises(LeaseLost):
        journal.append({"id": "p:1", "status": "skipped", "reason": "prompt_too_long"})
    segments = [k for k in store.list(PREFIX) if k.endswith(".jsonl")]
    # The fencing token starts the writer id (hex, as the key's readers expect).
    assert len(segments) == 1 and re.search(r"/part-\d+-00000001[0-9a-f]{12}-\d+\.jsonl$",
                                            segments[0])
    retry.release(complete=False)


def test_a_dead_holders_lease_expires_after_its_ttl_not_the_task_timeout(tmp_path) -> None:
    """Before: a live run whose shard task died blocked the shard for the 6 h task timeout."""
    store = LocalStore(tmp_path)
    dead = try_take(store, PREFIX, 1, "run-1/dead", "run-1", ttl_s=1.0)  # never renews
    assert dead is not None
    began = time.monotonic()
    # Its run is live (other shards still generate), and that no longer matters.
    taken = _turn(store, "backfill", is_live=lambda r: True, timeout_s=10)
    waited = time.monotonic() - began
    assert taken.generation == 2
    assert 1.0 <= waited < 3.0, waited  # one TTL by the waiter's own clock, from its look
    taken.release(complete=False)


def test_a_holder_that_cannot_renew_stops_before_a_waiter_may_take_over(tmp_path) -> None:
    store = LocalStore(tmp_path)
    holder = _turn(store, "run-1", ttl_s=0.4)

    class NoBeats(LocalStore):
        def write_new(self, key, data):
            if "/beats/" in key:
                raise OSError("store unreachable")
            return super().write_new(key, data)

    holder.store = NoBeats(tmp_path)
    time.sleep(0.35)
    assert holder.lost() is not None  # at 0.75 TTL without a renewal, by its own clock
    assert newest(store, PREFIX).generation == 1  # nobody could take it over yet
    with pytest.raises(LeaseLost, match="not renewed for"):
        holder.check()
    holder.release(complete=True)  # a lost lease is not released: a waiter owns what comes
    assert newest(store, PREFIX).released is None


def _published_inputs(store: LocalStore) -> None:
    prompts = [{"id": f"p:{i}", "source": "t", "metadata": {},
                "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(3)]
    store.write_new(shard_key(0), b"".join(encode_record(p) for p in prompts))
    journal = StoreJournal(store, PREFIX)
    for p in prompts:
        journal.append({"id": p["id"], "status": "skipped", "reason": "prompt_too_long"})
    journal.close()


def test_a_late_publish_from_a_fenced_out_holder_is_refused(tmp_path) -> None:
    """Before: an upload held nothing, so any try's summary published whatever it built."""
    store = LocalStore(tmp_path)
    _published_inputs(store)
    old = try_take(store, PREFIX, 1, "run-1/old", "run-1", ttl_s=0.2)
    old.release(complete=True)
    new = _turn(store, "run-2", is_live=lambda r: False)  # run-1 ended unpublished
    stale = {"shard_id": SHARD, "already_done": False, "lease": old.token}
    with pytest.raises(LeaseLost, match="generation 1 was taken over"):
        publish_shard(SHARD, store, generation=stale)
    assert store.list("generated/") == []  # refused before anything was written
    manifest = publish_shard(SHARD, store, generation={"shard_id": SHARD,
                                                       "already_done": False,
                                                       "lease": new.token})
    assert manifest["lease"] == {"generation": 2, "holder": new.holder}
    assert json.loads(store.read(output_keys(SHARD)[1]))["lease"]["generation"] == 2
    new.release(complete=True)


def _airflow_answering(monkeypatch, answer) -> None:
    class RuntimeTaskInstance:
        @staticmethod
        def get_dagrun_state(dag_id, run_id):
            if isinstance(answer, Exception):
                raise answer
            return answer

    module = types.ModuleType("airflow.sdk.execution_time.task_runner")
    module.RuntimeTaskInstance = RuntimeTaskInstance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.task_runner", module)


def test_a_waiter_keeps_waiting_while_airflow_cannot_be_asked(tmp_path, monkeypatch) -> None:
    store = LocalStore(tmp_path)
    first = _turn(store, "run-1")
    first.release(complete=True)  # generated; run-1's upload is to come
    _airflow_answering(monkeypatch, ConnectionError("api-server down"))
    with pytest.raises(LeaseBusy):
        _turn(store, "backfill", is_live=airflow_run_is_live("dag"), timeout_s=0.3)
    assert newest(store, PREFIX).generation == 1


def test_renewals_are_numbered_objects_and_a_waiter_probes_only_the_next(tmp_path) -> None:
    store = LocalStore(tmp_path)
    holder = _turn(store, "run-1", ttl_s=0.2)
    time.sleep(0.3)
    holder.release(complete=False)
    assert holder.beats >= 3
    assert all(store.exists(beat_key(PREFIX, 1, n)) for n in range(1, holder.beats + 1))
    assert lease.count_beats(store, PREFIX, 1) == holder.beats
    assert lease.count_beats(store, PREFIX, 1, known=1) == holder.beats
    # The generations' prefix holds only takes and releases, however long a holder runs.
    assert store.list(f"{PREFIX}/lease/") == [lease_key(PREFIX, 1),
                                              lease.released_key(PREFIX, 1)]
