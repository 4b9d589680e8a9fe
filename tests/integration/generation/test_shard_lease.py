"""One writer per shard (issue 18), through ``generate_shard`` and ``publish_shard`` against
real stand-ins: skewed clocks, a zombie try and its retry, a dead try, a fenced-out upload,
a holder paused mid-PUT whose segment lands after the takeover (issue 26).

Only names today's code has too are used, so each test fails on the code before the lease
by what it does, not by an import."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from include.durability.journal import load_journal_records
from include.generation.shard import generate_shard, publish_shard
from include.layout import journal_prefix, lease_key, output_keys
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
from tests.integration.generation.helpers import ROOT, chat_prompt, make_prompts, write_shard

pytestmark = pytest.mark.integration
SHARD = "shard-00000"
N = 60
FAST = {"all_down_timeout_s": 5.0, "cool_down_s": 0.2, "cool_down_max_s": 0.5,
        "backoff_base_s": 0.05}


def _settings(tmp_path, tokenizer_dir) -> tuple[dict, dict]:
    """Return (run settings, deployment settings) of the lease tests' run."""
    run = {"run_name": "r", "tokenizer_path": str(tokenizer_dir), "model_path": "test-model",
           "max_tokens": 128, "min_completion_tokens": 16, "context_length": 4096,
           "concurrency_mode": "fixed", "in_flight_per_server": 4,
           "health_interval_s": 0.3, "progress_interval_s": 1}
    return run, {"output_root": str(tmp_path / "out")}


@pytest.fixture
def shard(standins, tokenizer_dir, tmp_path):
    """A run store with one prompt shard, slow stand-ins (a few seconds a shard), settings."""
    servers = standins(2, standin_time_scale=0.1)
    store = LocalStore(tmp_path / "out" / "r")
    prompts = make_prompts(N)
    write_shard(store, prompts)
    return store, [s.url for s in servers], _settings(tmp_path, tokenizer_dir), prompts


def _generate(store, urls, values, run_id, is_live, **kw):
    run, deployment = values
    return generate_shard(run_settings(run, **deployment), SHARD, urls, store, run_id=run_id,
                          is_live=is_live, **FAST, **kw)


def _start(fn, name: str):
    out: dict = {}

    def run():
        try:
            out["summary"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, out


def _first_to_finish(tries, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for thread, out in tries:
            if not thread.is_alive():
                return thread, out
        time.sleep(0.02)
    raise AssertionError("no try finished")


def _generated(summary: dict) -> int:
    """Prompts this try sent to a server (not found finished in the journal)."""
    return 0 if summary["already_done"] else N - summary["resumed"]


def test_two_runs_with_skewed_clocks_generate_a_shard_once(shard, monkeypatch) -> None:
    store, urls, values, _ = shard
    real = time.time
    # The backfill's worker clock runs 50 ms behind the first run's.
    monkeypatch.setattr(time, "time", lambda: real() - (
        0.05 if threading.current_thread().name == "backfill" else 0.0))
    live = {"manual__first", "backfill__1"}
    first = _start(lambda: _generate(store, urls, values, "manual__first",
                                     live.__contains__), "first")
    time.sleep(0.01)
    backfill = _start(lambda: _generate(store, urls, values, "backfill__1",
                                        live.__contains__), "backfill")
    done_thread, done = _first_to_finish([first, backfill])
    assert "summary" in done, done.get("error")
    publish_shard(SHARD, store, generation=done["summary"])  # the generator's upload
    other = backfill if done_thread is first[0] else first
    other[0].join(30)
    assert "summary" in other[1], other[1].get("error")
    assert other[1]["summary"]["already_done"], "both runs generated the shard"
    assert _generated(done["summary"]) == N


def test_a_zombie_try_and_its_retry_generate_the_shard_once(shard) -> None:
    store, urls, values, prompts = shard
    # Airflow gave up on the first try (a lost heartbeat) but its process goes on.
    zombie = _start(lambda: _generate(store, urls, values, "run-1", lambda r: True),
                    "zombie")
    time.sleep(0.3)
    retry = _start(lambda: _generate(store, urls, values, "run-1", lambda r: True),
                   "retry")
    for thread, _ in (zombie, retry):
        thread.join(60)
    summaries = [out["summary"] for _, out in (zombie, retry)]
    assert sum(_generated(s) for s in summaries) == N, "a prompt was generated twice"
    manifest = publish_shard(SHARD, store, generation=summaries[1])  # the retry's upload
    assert manifest["counts"]["completed"] == N
    assert sorted(load_journal_records(store, SHARD)) == sorted(p["id"] for p in prompts)


# A 2 s TTL where the code has one, so the same script shows the code before the lease.
_DEAD_TRY = """
import inspect, json, sys
from include.generation.shard import generate_shard
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
run, deployment = json.loads(sys.argv[1]), json.loads(sys.argv[2])
urls = sys.argv[3].split(",")
ttl = {"lease_ttl_s": 2.0} if "lease_ttl_s" in inspect.signature(generate_shard).parameters else {}
generate_shard(run_settings(run, **deployment), "shard-00000", urls, LocalStore(sys.argv[4]),
               run_id="run-a", is_live=lambda r: True, **ttl)
"""


def test_a_dead_try_of_a_live_run_blocks_a_backfill_for_seconds_not_hours(
    shard, tmp_path
) -> None:
    store, urls, values, _ = shard
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _DEAD_TRY, *map(json.dumps, values),
                             ",".join(urls), store.root], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and len(load_journal_records(store, SHARD)) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = len(load_journal_records(store, SHARD))
    finally:
        proc.send_signal(signal.SIGKILL)  # the task dies; run-a stays live for hours
        _, err = proc.communicate()
    assert 0 < before < N, err.decode(errors="replace")[-2000:]
    began = time.monotonic()
    backfill = _start(lambda: _generate(store, urls, values, "backfill__1",
                                        lambda r: True), "backfill")
    backfill[0].join(30)
    assert "summary" in backfill[1], backfill[1].get("error", "still waiting after 30s")
    assert time.monotonic() - began < 20
    assert backfill[1]["summary"]["resumed"] >= before  # the dead try's prompts are kept


def test_a_late_upload_from_a_fenced_out_try_is_refused(shard) -> None:
    store, urls, values, _ = shard
    live = {"run-1"}
    first = _generate(store, urls, values, "run-1", live.__contains__)
    # run-1 is marked failed before its upload ran (its upload is now a zombie); a backfill
    # takes the shard over and generates it (every prompt is in the journal already).
    live.clear()
    second = _generate(store, urls, values, "run-2", live.__contains__)
    assert second["resumed"] == N
    with pytest.raises(Exception, match="taken over"):
        publish_shard(SHARD, store, generation=first)
    assert store.list("generated/") == []  # nothing of the late write reached the store
    manifest = publish_shard(SHARD, store, generation=second)
    assert manifest["counts"]["completed"] == N
    stored = json.loads(store.read(output_keys(SHARD)[1]))
    assert stored["lease"] == second["lease"] and stored["lease"]["generation"] == 2
    segments = [k for k in store.list(journal_prefix(SHARD)) if "/part-" in k]
    # Every segment carries its writer's lease generation, the fencing token: the first's.
    assert segments and all(re.search(r"/part-\d+-00000001[0-9a-f]{12}-\d+\.jsonl$", k)
                            for k in segments)


# A holder whose second journal segment is on the wire when the network cuts and the worker
# is paused (SIGSTOP): the PUT lands when the process is continued, after the takeover.
_PAUSED_TRY = """
import json, os, signal, sys, time
from pathlib import Path
from include.generation.shard import generate_shard
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
run, deployment = json.loads(sys.argv[1]), json.loads(sys.argv[2])
marker = Path(sys.argv[5])

class PausedMidPut(LocalStore):
    segments = 0

    def write_new(self, key, data):
        if "/part-" in key:
            self.segments += 1
            if self.segments == 2:
                tmp = marker.with_suffix(".tmp")
                tmp.write_text(json.dumps({"key": key, "lines": data.decode()}))
                tmp.rename(marker)
                os.kill(os.getpid(), signal.SIGSTOP)
                # Linux may stop this thread only after kill() returns (another thread takes
                # the group stop), and the PUT would land before the takeover: it waits for
                # the test's word, sent with SIGCONT.
                go = marker.with_suffix(".go")
                while not go.exists():
                    time.sleep(0.01)
        return super().write_new(key, data)

generate_shard(run_settings(run, **deployment), "shard-00000", sys.argv[3].split(","),
               PausedMidPut(sys.argv[4]), run_id="run-a", is_live=lambda r: True,
               lease_ttl_s=2.0, all_down_timeout_s=5.0, cool_down_s=0.2)
"""


def test_a_paused_holders_segment_landing_after_the_takeover_never_reaches_the_output(
    standins, tokenizer_dir, tmp_path
) -> None:
    """Before: publishing kept the paused holder's records of the prompts (and turns) in its
    late segment, whose key (stamped before the pause) sorted first, over the new holder's,
    while the manifest named the new generation."""
    old_server, new_server = standins(2, standin_time_scale=0.1)
    store = LocalStore(tmp_path / "out" / "r")
    prompts = [chat_prompt(i) for i in range(6)] + make_prompts(40)
    write_shard(store, prompts)
    values = _settings(tmp_path, tokenizer_dir)
    values[0]["turns"] = "all"
    marker = tmp_path / "paused.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_TRY, *map(json.dumps, values),
                             old_server.url, store.root, str(marker)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.communicate()[1].decode(errors="replace")[-2000:]
            time.sleep(0.05)
        stale = json.loads(marker.read_text())
        # Another try takes the shard over once the paused holder's lease expires.
        summary = _generate(store, [new_server.url], values, "run-b", lambda r: True)
        assert summary["lease"]["generation"] == 2
    finally:
        marker.with_suffix(".go").touch()
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    # The takeover counted the paused holder's segments in the store then: the first only.
    taken = json.loads(store.read(lease_key(journal_prefix(SHARD), 2)))
    assert list(taken["segments"].values()) == [1], taken
    # Continued, it finds its lease lost and stops, publishing nothing.
    assert proc.returncode != 0 and "lease generation 1" in err.decode(errors="replace")
    assert store.exists(stale["key"])  # the late PUT did land, after the takeover
    manifest = publish_shard(SHARD, store, generation=summary)
    assert manifest["lease"]["generation"] == 2
    rows = {r["id"]: r for r in map(json.loads, store.read(output_keys(SHARD)[0]).splitlines())}
    assert sorted(rows) == sorted(p["id"] for p in prompts)
    late = [json.loads(x) for x in stale["lines"].splitlines()]
    assert late
    for record in late:
        if record.get("kind") == "conversation_turn":
            turn = next(t for t in rows[record["conversation_id"]]["turn_results"]
                        if t["index"] == record["turn"])
            assert turn["server"] == new_server.url, record["id"]
        elif record.get("kind") is None and record["id"] in rows:
            assert rows[record["id"]] != {**record, **{k: rows[record["id"]][k] for k in (
                "messages", "metadata") if k in rows[record["id"]]}}, record["id"]
            if not record.get("turns"):
                assert rows[record["id"]]["server"] == new_server.url, record["id"]
