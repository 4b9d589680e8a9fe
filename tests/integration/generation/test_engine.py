"""The engine against real stand-in server processes: every prompt accounted for, always."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from include.generation.engine import EngineConfig, GenerationError, run_shard
from include.generation.journal import FileJournal, StoreJournal
from include.generation.shard import build_shard_output, generate_shard, load_journal_records
from include.prompts.prepare import encode_record, shard_key
from include.storage import LocalStore
from include.tokenization import count_prompt_tokens, load_tokenizer
from tests.fixtures.settings import run_settings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def _prompts(n: int, words: int = 12, prefix: str = "p") -> list[dict]:
    return [
        {"id": f"{prefix}:{i}", "source": "test", "metadata": {},
         "messages": [{"role": "user", "content": f"Question {i}: " + "explain this " * words}]}
        for i in range(n)
    ]


def _config(**overrides) -> EngineConfig:
    values = dict(model="test-model", context_length=4096, max_tokens=256, context_margin=16,
                  min_completion_tokens=16, sampling={"temperature": 0.6, "top_p": 0.95,
                                                       "top_k": 20, "enable_thinking": True},
                  concurrency_mode="fixed", in_flight_per_server=8, request_timeout_s=30,
                  health_interval_s=0.3, progress_interval_s=1.0, max_attempts=4,
                  backoff_base_s=0.05, backoff_max_s=0.5, all_down_timeout_s=20)
    values.update(overrides)
    return EngineConfig(**values)


def _counter(tokenizer_dir):
    tok = load_tokenizer(str(tokenizer_dir))
    return lambda convs: count_prompt_tokens(tok, convs, True)


def _assert_accounted(prompts, outcome_records) -> dict:
    ids = [p["id"] for p in prompts]
    assert sorted(outcome_records) == sorted(ids)
    data, manifest = build_shard_output("shard-00000", prompts, outcome_records)
    out_ids = [json.loads(line)["id"] for line in data.splitlines()]
    assert len(out_ids) == len(set(out_ids)), "a prompt is in the output twice"
    assert manifest["counts"]["completed"] == len(out_ids)
    assert sum(manifest["counts"].values()) == len(prompts)
    return manifest


def test_8192_cap_on_8192_context_sends_no_request_the_server_must_reject(
    standins, tokenizer_dir, tmp_path, caplog
) -> None:
    servers = standins(2, context_length=8192)
    prompts = _prompts(20) + _prompts(2, words=4000, prefix="long") + \
        _prompts(2, words=2700, prefix="near")
    cfg = _config(context_length=8192, max_tokens=8192, min_completion_tokens=256)
    with caplog.at_level(logging.WARNING):
        outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                            FileJournal(tmp_path / "j.jsonl"), cfg, _counter(tokenizer_dir))
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["failed"] == 0
    skipped = {s["id"] for s in manifest["skipped"]}
    assert {"long:0", "long:1"} <= skipped
    assert all(s["reason"] == "prompt_too_long" for s in manifest["skipped"])
    assert "server counted" not in caplog.text  # no length 400 was ever answered
    for s in servers:
        assert " 400 " not in s.log_path.read_text()
    for rec in outcome.records.values():
        if rec["status"] == "completed":
            assert rec["usage"]["prompt_tokens"] + rec["sampling"]["max_tokens"] < 8192


def test_a_server_that_counts_more_prompt_tokens_gets_one_corrected_retry(
    standins, tokenizer_dir, tmp_path, caplog
) -> None:
    servers = standins(1, context_length=2048)
    prompts = _prompts(6, words=100)
    exact = _counter(tokenizer_dir)
    undercount = lambda convs: [n - 300 for n in exact(convs)]  # noqa: E731
    cfg = _config(context_length=2048, max_tokens=4096)
    with caplog.at_level(logging.WARNING):
        outcome = run_shard("shard-00000", prompts, [servers[0].url],
                            FileJournal(tmp_path / "j.jsonl"), cfg, undercount)
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 6
    assert "server counted" in caplog.text
    for rec in outcome.records.values():
        assert rec["usage"]["prompt_tokens"] + rec["sampling"]["max_tokens"] < 2048


def test_server_killed_mid_shard_loses_and_repeats_nothing(
    standins, tokenizer_dir, tmp_path
) -> None:
    healthy = standins(2)
    dying = standins(1, standin_crash_after_requests=15)
    prompts = _prompts(120)
    outcome = run_shard("shard-00000", prompts, [s.url for s in healthy + dying],
                        FileJournal(tmp_path / "j.jsonl"), _config(), _counter(tokenizer_dir))
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 120
    assert not dying[0].is_alive()
    stats = {s["url"]: s for s in outcome.servers}
    assert stats[dying[0].url]["ejections"] >= 1
    assert stats[dying[0].url]["completed"] <= 15


def test_server_dead_from_the_start_is_left_out(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(1)
    prompts = _prompts(30)
    outcome = run_shard("shard-00000", prompts, [servers[0].url, "http://127.0.0.1:9"],
                        FileJournal(tmp_path / "j.jsonl"), _config(), _counter(tokenizer_dir))
    assert _assert_accounted(prompts, outcome.records)["counts"]["completed"] == 30


def test_intermittent_500s_and_dropped_connections_are_retried(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2, standin_error_rate=0.2, standin_drop_rate=0.1)
    prompts = _prompts(80)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        _config(max_attempts=8, eject_after_failures=50),
                        _counter(tokenizer_dir))
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 80
    assert any(r["timings"]["attempts"] > 1 for r in outcome.records.values())


def test_a_server_that_always_fails_ends_in_recorded_failures(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(1, standin_error_rate=1.0)
    prompts = _prompts(10)
    outcome = run_shard("shard-00000", prompts, [servers[0].url],
                        FileJournal(tmp_path / "j.jsonl"),
                        _config(max_attempts=3, eject_after_failures=1000),
                        _counter(tokenizer_dir))
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["failed"] == 10
    assert {f["reason"] for f in manifest["failed"]} == {"http_5xx"}
    assert all(outcome.records[f["id"]]["attempts"] == 3 for f in manifest["failed"])


def test_a_hanging_server_times_out_and_its_work_moves_elsewhere(
    standins, tokenizer_dir, tmp_path
) -> None:
    good = standins(1)
    hanging = standins(1, standin_hang_after_requests=3)
    prompts = _prompts(40)
    outcome = run_shard("shard-00000", prompts, [good[0].url, hanging[0].url],
                        FileJournal(tmp_path / "j.jsonl"),
                        _config(request_timeout_s=2, eject_after_failures=2),
                        _counter(tokenizer_dir))
    manifest = _assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 40
    assert {s["url"]: s for s in outcome.servers}[hanging[0].url]["completed"] <= 3


def test_wrong_api_key_fails_fast_with_a_clear_error(standins, tokenizer_dir, tmp_path):
    servers = standins(1, api_key="right-key")
    journal = FileJournal(tmp_path / "j.jsonl")
    with pytest.raises(GenerationError, match="api_key"):
        run_shard("shard-00000", _prompts(5), [servers[0].url], journal,
                  _config(api_key="wrong-key"), _counter(tokenizer_dir))
    journal.close()
    assert FileJournal(tmp_path / "j.jsonl").load() == {}


def test_right_api_key_works(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(1, api_key="right-key")
    prompts = _prompts(5)
    outcome = run_shard("shard-00000", prompts, [servers[0].url],
                        FileJournal(tmp_path / "j.jsonl"), _config(api_key="right-key"),
                        _counter(tokenizer_dir))
    assert _assert_accounted(prompts, outcome.records)["counts"]["completed"] == 5


def test_adaptive_mode_completes_and_grows_windows(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(2)
    prompts = _prompts(300)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        _config(concurrency_mode="adaptive", in_flight_per_server=4,
                                min_in_flight_per_server=4, max_in_flight_per_server=128,
                                metrics_interval_s=0.1),
                        _counter(tokenizer_dir))
    assert _assert_accounted(prompts, outcome.records)["counts"]["completed"] == 300
    assert max(s["final_window"] for s in outcome.servers) > 4


def _write_shard(store: LocalStore, prompts: list[dict]) -> None:
    store.write_new(shard_key(0), b"".join(encode_record(p) for p in prompts))


def test_killed_process_resumes_without_loss_or_duplicates(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2, standin_time_scale=0.2)
    prompts = _prompts(150)
    run_root = tmp_path / "out" / "r"
    store = LocalStore(run_root)
    _write_shard(store, prompts)
    settings = {"output_uri": str(tmp_path / "out"), "run_name": "r",
                "tokenizer_path": str(tokenizer_dir), "model_path": "test-model",
                "max_tokens": 128, "min_completion_tokens": 16, "context_length": 4096,
                "concurrency_mode": "fixed", "in_flight_per_server": 8,
                "health_interval_s": 0.5, "progress_interval_s": 1}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "include.generation", "--shard", "shard-00000",
         "--servers", ",".join(s.url for s in servers), "--settings",
         str(tmp_path / "settings.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(load_journal_records(store, "shard-00000")) < 20:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = load_journal_records(store, "shard-00000")
    assert 0 < len(before) < 150, "the kill should land mid-shard"

    summary = generate_shard(run_settings(settings), "shard-00000",
                             [s.url for s in servers], store)
    assert summary["resumed"] == len(before)
    records = load_journal_records(store, "shard-00000")
    manifest = _assert_accounted(prompts, records)
    assert manifest["counts"]["completed"] == 150
    for pid, rec in before.items():  # what the first run finished is kept, not redone
        assert records[pid] == rec

    again = generate_shard(run_settings(settings), "shard-00000",
                           [s.url for s in servers], store)
    assert again["resumed"] == 150 and again["counts"]["completed"] == 150


def test_store_journal_keeps_a_shard_resumable_across_workers(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(1)
    prompts = _prompts(40)
    store = LocalStore(tmp_path)
    first = StoreJournal(store, "journal/shard-00000", flush_every=5)
    run_shard("shard-00000", prompts[:25], [servers[0].url], first, _config(),
              _counter(tokenizer_dir))
    first.close()
    second = StoreJournal(store, "journal/shard-00000", flush_every=5)
    outcome = run_shard("shard-00000", prompts, [servers[0].url], second, _config(),
                        _counter(tokenizer_dir))
    assert outcome.resumed == 25
    _assert_accounted(prompts, outcome.records)
