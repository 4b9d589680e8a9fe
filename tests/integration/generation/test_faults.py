"""Faults of a long night, against real stand-ins: a live server keeps its in-flight work
(only a gone one loses it), a brownout or a slow journal write costs no prompt, and failures
an outage left in the journal are tried again on resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from include.durability.journal import FileJournal, StoreJournal, load_journal_records
from include.engine.dispatch import GenerationError, run_shard
from include.generation.shard import generate_shard, publish_shard
from include.layout import journal_prefix, output_keys
from include.outcomes import ErrorKind
from include.sglang.contract import HEALTH_PROBE_TIMEOUT_FLOOR_S
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
from tests.integration.generation.faultproxy import (
    QUEUE_FULL,
    UNAVAILABLE,
    Brownout,
    FaultProxy,
)
from tests.integration.generation.helpers import (
    assert_accounted,
    engine_config,
    generated_requests,
    make_prompts,
    token_counter,
    write_shard,
)

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)


def _nothing_taken_back(outcome) -> None:
    assert [s["ejections"] for s in outcome.servers] == [0] * len(outcome.servers)
    assert "server_ejected" not in outcome.retries
    # Every request is a first try or a logged, counted retry.
    assert outcome.requests == outcome.total - outcome.resumed + sum(outcome.retries.values())


def test_5_percent_500s_cost_few_extra_requests_and_eject_nothing(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(4, standin_error_rate=0.05)
    prompts = make_prompts(400)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        engine_config(concurrency_mode="adaptive", in_flight_per_server=16,
                                      min_in_flight_per_server=8, max_in_flight_per_server=128,
                                      metrics_interval_s=0.2),
                        token_counter(tokenizer_dir))
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 400
    _nothing_taken_back(outcome)
    log.warning("5%% 500s: %d requests for %d prompts (%.3f per prompt), retries %s",
                outcome.requests, 400, outcome.requests / 400, outcome.retries)
    # 5% errors alone need 1/0.95 = 1.05 requests per prompt; the drill saw 1.15-1.53.
    assert outcome.requests / 400 < 1.15


def test_request_timeouts_rest_a_live_server_without_taking_its_work_back(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2, standin_hang_rate=0.2)
    prompts = make_prompts(80)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        engine_config(request_timeout_s=1.0, max_attempts=8),
                        token_counter(tokenizer_dir))
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 80
    assert outcome.retries["timeout"] > 0
    _nothing_taken_back(outcome)


def test_a_live_server_that_stops_answering_for_a_while_keeps_its_in_flight_work(
    standins, tokenizer_dir, tmp_path, caplog
) -> None:
    servers = standins(2, standin_time_scale=0.2)
    prompts = make_prompts(150)
    journal_path = tmp_path / "j.jsonl"
    lines_when_resumed: list[int] = []

    def pause() -> None:  # like a host under CPU load: alive, silent for 3 s (< 3 probes)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not journal_path.exists() or journal_path.read_bytes().count(b"\n") < 20
        ):
            time.sleep(0.02)
        os.kill(servers[1].pid, signal.SIGSTOP)
        # Longer than a probe may take (SGLang's /health alone takes 1 s): the probes fail.
        time.sleep(HEALTH_PROBE_TIMEOUT_FLOOR_S + 2.0)
        os.kill(servers[1].pid, signal.SIGCONT)
        lines_when_resumed.append(journal_path.read_bytes().count(b"\n"))

    pauser = threading.Thread(target=pause)
    pauser.start()
    try:
        with caplog.at_level(logging.WARNING):
            outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                                FileJournal(journal_path),
                                engine_config(health_interval_s=0.5, request_timeout_s=60),
                                token_counter(tokenizer_dir))
    finally:
        pauser.join()
    assert lines_when_resumed[0] < 150, "the pause should land mid-shard"
    assert "no new requests until a probe passes" in caplog.text  # the probes did fail
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 150
    _nothing_taken_back(outcome)
    # By the servers' own count, each prompt was generated once: the paused server's
    # in-flight requests were not sent again. One of them can still meet "Connection reset by
    # peer" as the server wakes (CI, and 4 in 71 runs under load); that server had not
    # generated it, and it goes out again as a counted retry.
    assert sum(generated_requests(s.url) for s in servers) == 150
    assert set(outcome.retries) <= {ErrorKind.DISCONNECTED}, outcome.retries


class SlowStore(LocalStore):
    """A store whose every write takes longer than a health probe may."""

    def write_new(self, key: str, data: bytes) -> bool:
        time.sleep(HEALTH_PROBE_TIMEOUT_FLOOR_S + 1.0)
        return super().write_new(key, data)


def test_a_slow_journal_write_stalls_no_health_probe(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(2, standin_time_scale=0.2)
    # /health takes 1.2 s (a loaded host), so a probe is nearly always in flight; its timeout
    # (the floor) is shorter than one journal write.
    proxies = [FaultProxy(s.url, health_delay_s=1.2).start() for s in servers]
    prompts = make_prompts(250)
    journal = StoreJournal(SlowStore(tmp_path), "journal/shard-00000")
    config = engine_config(health_interval_s=0.2)
    try:
        outcome = run_shard("shard-00000", prompts, [p.url for p in proxies], journal, config,
                            token_counter(tokenizer_dir))
    finally:
        journal.close()
        for proxy in proxies:
            proxy.stop()
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 250
    _nothing_taken_back(outcome)
    assert len(StoreJournal(LocalStore(tmp_path), "journal/shard-00000").load()) == 250


@pytest.mark.parametrize("body", [QUEUE_FULL, UNAVAILABLE], ids=["queue_full", "plain_503"])
def test_a_brownout_of_every_server_leaves_no_prompt_failed(
    standins, tokenizer_dir, tmp_path, body
) -> None:
    # 6 s of 503s against cool-downs of 0.5 s doubling to 4 s: production's 30 s brownout
    # against 5 s doubling to 60 s, time-compressed.
    servers = standins(3, standin_time_scale=0.05)
    brownout = Brownout(after_requests=60, seconds=6.0, body=body)
    proxies = [FaultProxy(s.url, brownout).start() for s in servers]
    prompts = make_prompts(240)
    try:
        outcome = run_shard("shard-00000", prompts, [p.url for p in proxies],
                            FileJournal(tmp_path / "j.jsonl"),
                            engine_config(cool_down_s=0.5, cool_down_max_s=4.0,
                                          health_interval_s=0.5),
                            token_counter(tokenizer_dir))
    finally:
        for proxy in proxies:
            proxy.stop()
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"] == {"completed": 240, "skipped": 0, "failed": 0}
    assert brownout.rejected > 0
    kind = "queue_full" if body is QUEUE_FULL else "http_5xx"
    assert outcome.retries == {kind: brownout.rejected}  # each one logged and counted
    assert outcome.requests == 240 + brownout.rejected
    assert max(s["cool_downs"] for s in outcome.servers) >= 2
    log.warning("brownout of %.0fs: %d requests for %d prompts (%d answered 503)",
                brownout.seconds, outcome.requests, 240, brownout.rejected)


def test_failures_an_outage_journaled_are_tried_again_on_resume_and_replaced(
    standins, tokenizer_dir, tmp_path
) -> None:
    broken = standins(2, standin_error_rate=1.0)
    prompts = make_prompts(20)
    store = LocalStore(tmp_path / "out" / "r")
    write_shard(store, prompts)
    settings = run_settings({
        "run_name": "r",
        "tokenizer_path": str(tokenizer_dir), "model_path": "test-model", "max_tokens": 128,
        "min_completion_tokens": 16, "context_length": 4096, "concurrency_mode": "fixed",
        "in_flight_per_server": 8, "health_interval_s": 0.3, "progress_interval_s": 1,
        "max_attempts": 1,  # so the outage's first failure on each server is recorded
    }, output_root=str(tmp_path / "out"))
    fast = {"all_down_timeout_s": 1.0, "cool_down_s": 0.2, "cool_down_max_s": 0.5,
            "backoff_base_s": 0.05}
    with pytest.raises(GenerationError, match="no server in rotation"):
        generate_shard(settings, "shard-00000", [s.url for s in broken], store, **fast)
    first = load_journal_records(store, "shard-00000")
    failed = {pid for pid, rec in first.items() if rec["status"] == "failed"}
    assert failed and {first[pid]["reason"] for pid in failed} == {"http_5xx"}

    healthy = standins(2)
    summary = generate_shard(settings, "shard-00000", [s.url for s in healthy], store, **fast)
    assert summary["retried_failures"] == len(failed)
    assert summary["counts"] == {"completed": 20, "skipped": 0, "failed": 0}
    # The failure lines are still in the journal; the later completions replaced them.
    lines = [json.loads(line) for key in store.list(journal_prefix("shard-00000"))
             if key.endswith(".jsonl") for line in store.read(key).splitlines()]
    for pid in failed:
        assert [r["status"] for r in lines if r["id"] == pid] == ["failed", "completed"]
    manifest = publish_shard("shard-00000", store)
    assert manifest["counts"] == {"completed": 20, "skipped": 0, "failed": 0}
    published = [json.loads(line)["id"] for line in
                 Path(store.uri(output_keys("shard-00000")[0])).read_bytes().splitlines()]
    assert sorted(published) == sorted(p["id"] for p in prompts)
