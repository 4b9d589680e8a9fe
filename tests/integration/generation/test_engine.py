"""The engine against real stand-in server processes: every prompt accounted for, always."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from include.durability.journal import FileJournal, StoreJournal, load_journal_records
from include.engine.dispatch import GenerationError, run_shard
from include.generation.shard import generate_shard
from include.storage import LocalStore
from tests.fixtures.settings import deployment_env, run_settings
from tests.integration.generation.helpers import (
    ROOT,
    assert_accounted,
    engine_config,
    make_prompts,
    token_counter,
    write_shard,
)

pytestmark = pytest.mark.integration


def test_8192_cap_on_8192_context_sends_no_request_the_server_must_reject(
    standins, tokenizer_dir, tmp_path, caplog
) -> None:
    servers = standins(2, context_length=8192)
    prompts = make_prompts(20) + make_prompts(2, words=4000, prefix="long") + \
        make_prompts(2, words=2700, prefix="near")
    cfg = engine_config(context_length=8192, max_tokens=8192, min_completion_tokens=256)
    with caplog.at_level(logging.WARNING):
        outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                            FileJournal(tmp_path / "j.jsonl"), cfg, token_counter(tokenizer_dir))
    manifest = assert_accounted(prompts, outcome.records)
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
    prompts = make_prompts(6, words=100)
    exact = token_counter(tokenizer_dir)
    undercount = lambda convs: [n - 300 for n in exact(convs)]  # noqa: E731
    cfg = engine_config(context_length=2048, max_tokens=4096)
    with caplog.at_level(logging.WARNING):
        outcome = run_shard("shard-00000", prompts, [servers[0].url],
                            FileJournal(tmp_path / "j.jsonl"), cfg, undercount)
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 6
    assert "server counted" in caplog.text
    for rec in outcome.records.values():
        assert rec["usage"]["prompt_tokens"] + rec["sampling"]["max_tokens"] < 2048


def test_server_killed_mid_shard_loses_and_repeats_nothing(
    standins, tokenizer_dir, tmp_path
) -> None:
    healthy = standins(2)
    dying = standins(1, standin_crash_after_requests=15)
    prompts = make_prompts(120)
    outcome = run_shard("shard-00000", prompts, [s.url for s in healthy + dying],
                        FileJournal(tmp_path / "j.jsonl"), engine_config(),
                        token_counter(tokenizer_dir))
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 120
    assert not dying[0].is_alive()
    stats = {s["url"]: s for s in outcome.servers}
    assert stats[dying[0].url]["ejections"] >= 1
    assert stats[dying[0].url]["completed"] <= 15


def test_server_dead_from_the_start_is_left_out(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(1)
    prompts = make_prompts(30)
    outcome = run_shard("shard-00000", prompts, [servers[0].url, "http://127.0.0.1:9"],
                        FileJournal(tmp_path / "j.jsonl"), engine_config(),
                        token_counter(tokenizer_dir))
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 30


def test_intermittent_500s_and_dropped_connections_are_retried_without_ejecting(
    standins, tokenizer_dir, tmp_path
) -> None:
    # 20% 500s and 10% drops make failure streaks common: the servers rest, never lose work.
    servers = standins(2, standin_error_rate=0.2, standin_drop_rate=0.1)
    prompts = make_prompts(80)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        engine_config(max_attempts=8, cool_down_s=0.05, cool_down_max_s=0.2),
                        token_counter(tokenizer_dir))
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 80
    assert any(r["timings"]["attempts"] > 1 for r in outcome.records.values())
    assert all(s["ejections"] == 0 for s in outcome.servers)
    assert "server_ejected" not in outcome.retries
    assert outcome.requests == 80 + sum(outcome.retries.values())


def test_a_hanging_server_times_out_and_its_work_moves_elsewhere(
    standins, tokenizer_dir, tmp_path
) -> None:
    good = standins(1)
    hanging = standins(1, standin_hang_after_requests=3)
    prompts = make_prompts(40)
    outcome = run_shard("shard-00000", prompts, [good[0].url, hanging[0].url],
                        FileJournal(tmp_path / "j.jsonl"),
                        engine_config(request_timeout_s=2, cool_down_after_failures=2),
                        token_counter(tokenizer_dir))
    manifest = assert_accounted(prompts, outcome.records)
    assert manifest["counts"]["completed"] == 40
    assert {s["url"]: s for s in outcome.servers}[hanging[0].url]["completed"] <= 3


def test_wrong_api_key_fails_fast_with_a_clear_error(standins, tokenizer_dir, tmp_path):
    servers = standins(1, api_key="right-key")
    journal = FileJournal(tmp_path / "j.jsonl")
    with pytest.raises(GenerationError, match="REGEN_SGLANG_CONN_ID"):
        run_shard("shard-00000", make_prompts(5), [servers[0].url], journal,
                  engine_config(api_key="wrong-key"), token_counter(tokenizer_dir))
    journal.close()
    assert FileJournal(tmp_path / "j.jsonl").load() == {}


def test_right_api_key_works(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(1, api_key="right-key")
    prompts = make_prompts(5)
    outcome = run_shard("shard-00000", prompts, [servers[0].url],
                        FileJournal(tmp_path / "j.jsonl"), engine_config(api_key="right-key"),
                        token_counter(tokenizer_dir))
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 5


def test_adaptive_mode_completes_and_grows_windows(standins, tokenizer_dir, tmp_path) -> None:
    servers = standins(2)
    prompts = make_prompts(300)
    outcome = run_shard("shard-00000", prompts, [s.url for s in servers],
                        FileJournal(tmp_path / "j.jsonl"),
                        engine_config(concurrency_mode="adaptive", in_flight_per_server=4,
                                min_in_flight_per_server=4, max_in_flight_per_server=128,
                                metrics_interval_s=0.1),
                        token_counter(tokenizer_dir))
    assert assert_accounted(prompts, outcome.records)["counts"]["completed"] == 300
    assert max(s["final_window"] for s in outcome.servers) > 4


def test_killed_process_resumes_without_loss_or_duplicates(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(2, standin_time_scale=0.2)
    prompts = make_prompts(150)
    run_root = tmp_path / "out" / "r"
    store = LocalStore(run_root)
    write_shard(store, prompts)
    run = {"run_name": "r", "tokenizer_path": str(tokenizer_dir), "model_path": "test-model",
           "max_tokens": 128, "min_completion_tokens": 16, "context_length": 4096,
           "concurrency_mode": "fixed", "in_flight_per_server": 8,
           "health_interval_s": 0.5, "progress_interval_s": 1}
    deployment = {"output_root": str(tmp_path / "out"), "allowed_models": ["test-model"]}
    # The CLI takes the run's settings; the deployment's come from its environment.
    (tmp_path / "settings.json").write_text(json.dumps(run))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **deployment_env(deployment))
    command = [sys.executable, "-m", "include.pipeline.shard_cli", "--shard", "shard-00000",
               "--servers", ",".join(s.url for s in servers), "--settings",
               str(tmp_path / "settings.json")]
    out_path, err_path = tmp_path / "cli.out", tmp_path / "cli.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline and proc.poll() is None
               and (len(load_journal_records(store, "shard-00000")) < 20
                    or b"shard-00000 progress: " not in err_path.read_bytes())):
            time.sleep(0.1)
        assert proc.poll() is None, err_path.read_text(errors="replace")[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = load_journal_records(store, "shard-00000")
    assert 0 < len(before) < 150, "the kill should land mid-shard"
    # Killed before its summary: nothing on stdout, its log (Airflow's too) on stderr.
    assert out_path.read_bytes() == b"", out_path.read_text(errors="replace")[:2000]
    log_text = err_path.read_text(errors="replace")
    assert "settings checked; resolved" in log_text
    assert "shard-00000: 150 prompts, 0 already finished" in log_text
    assert "shard-00000 progress: " in log_text

    summary = generate_shard(run_settings(run, **deployment), "shard-00000",
                             [s.url for s in servers], store)
    assert summary["resumed"] == len(before)
    records = load_journal_records(store, "shard-00000")
    manifest = assert_accounted(prompts, records)
    assert manifest["counts"]["completed"] == 150
    for pid, rec in before.items():  # what the first run finished is kept, not redone
        assert records[pid] == rec

    # The CLI again, to its end: stdout is its summary, one JSON line; the log is on stderr.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and done.stdout == lines[0] + "\n", done.stdout[:2000]
    again = json.loads(lines[0])
    assert again["resumed"] == 150 and again["counts"]["completed"] == 150
    assert "shard-00000: 150 prompts, 150 already finished" in done.stderr


def test_store_journal_keeps_a_shard_resumable_across_workers(
    standins, tokenizer_dir, tmp_path
) -> None:
    servers = standins(1)
    prompts = make_prompts(40)
    store = LocalStore(tmp_path)
    first = StoreJournal(store, "journal/shard-00000", flush_every=5)
    run_shard("shard-00000", prompts[:25], [servers[0].url], first, engine_config(),
              token_counter(tokenizer_dir))
    first.close()
    second = StoreJournal(store, "journal/shard-00000", flush_every=5)
    outcome = run_shard("shard-00000", prompts, [servers[0].url], second, engine_config(),
                        token_counter(tokenizer_dir))
    assert outcome.resumed == 25
    assert_accounted(prompts, outcome.records)
