"""Tests of the subprocess helper and of faults that need a real process (crash, kill)."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from sglang_standin.process import StandinProcess, standin_command, start_standin
from sglang_standin.server import CRASH_EXIT_CODE
from sglang_standin.testing import call, chat

pytestmark = pytest.mark.integration  # starts real stand-in processes

FAST = {
    "standin_warmup_seconds": 0.2,
    "standin_time_scale": 0.01,
    "standin_median_output_tokens": 40,
}


def _refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_command_line_mirrors_sglang_launch_server() -> None:
    argv = standin_command(
        "/m", 30001, context_length=4096, enable_metrics=True, api_key=None, standin_seed=3
    )
    assert argv[1:] == [
        "-m",
        "sglang_standin",
        "--model-path",
        "/m",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        "--context-length",
        "4096",
        "--enable-metrics",
        "--standin-seed",
        "3",
    ]


def test_start_ready_line_ignored_flags_and_crash_after_n(tokenizer_dir: Path) -> None:
    with start_standin(
        None,
        tokenizer_dir,
        standin_crash_after_requests=2,
        trust_remote_code=True,
        dtype="bfloat16",
        **FAST,
    ) as proc:
        log = proc.log_path.read_text()
        assert re.search(
            r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$",
            log,
            re.MULTILINE,
        )
        assert (
            "ignoring SGLang flags it does not model: --trust-remote-code --dtype bfloat16" in log
        )
        assert chat(proc).status == 200
        assert chat(proc.url).status == 200
        with pytest.raises(OSError):
            chat(proc)  # the third request kills the server before it answers
        deadline = time.monotonic() + 10
        while proc.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.returncode == CRASH_EXIT_CODE
        assert _refuses(proc.port)
        assert "crashing (--standin-crash-after-requests=2)" in proc.log_path.read_text()


def test_kill_and_crash_after_seconds(tokenizer_dir: Path) -> None:
    # Both start at once (the import of transformers dominates start-up; two cores).
    crashing = StandinProcess(tokenizer_dir, **{**FAST, "standin_crash_after_seconds": 0.5})
    killed = StandinProcess(tokenizer_dir, **FAST)
    try:
        crashing.start(wait=False)
        killed.start()
        assert call("GET", killed.url + "/health").status == 200
        killed.kill()
        assert killed.returncode == -9 and _refuses(killed.port)
        deadline = time.monotonic() + 20
        while crashing.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert crashing.returncode == CRASH_EXIT_CODE and _refuses(crashing.port)
        log = crashing.log_path.read_text()
        assert log.index("ready to roll") < log.index("crashing (--standin-crash-after-seconds")
    finally:
        crashing.kill()
        killed.stop()


def test_failed_start_reports_the_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited with") as info:
        StandinProcess(tmp_path / "no-such-model", **FAST).start(timeout=30)
    assert "no-such-model" in str(info.value)


def test_the_port_stays_closed_while_the_model_loads(tokenizer_dir: Path) -> None:
    # http_server.py launch_server: Engine._launch_subprocesses (scheduler ready) before uvicorn.
    load = 1.5
    with start_standin(
        None, tokenizer_dir, wait=False, standin_load_seconds=load,
        **{**FAST, "standin_warmup_seconds": 0.5},
    ) as proc:  # fmt: skip
        proc.wait_for_log("loading the model for 1.5 s (port closed)", timeout=60)
        loading = time.monotonic()
        log = proc.log_path.read_text()
        assert log.index("server_args=") < log.index("loading the model")
        assert proc.is_alive() and _refuses(proc.port)
        time.sleep(0.5)
        assert proc.is_alive() and _refuses(proc.port)
        proc.wait_port_open(timeout=30)
        assert time.monotonic() - loading >= load - 0.1
        # Open, warming up: /health is 503 at once, the model list answers.
        assert call("GET", proc.url + "/health").status == 503
        assert call("GET", proc.url + "/v1/models").status == 200
        assert "ready to roll" not in proc.log_path.read_text()
        proc.wait_healthy(timeout=30)
        assert "ready to roll" in proc.log_path.read_text()


def test_a_colon_in_the_served_model_name_exits_before_the_port_opens(
    tokenizer_dir: Path,
) -> None:
    proc = StandinProcess(tokenizer_dir, served_model_name="org/drafter:v1", **FAST)
    proc.start(wait=False)
    try:
        deadline = time.monotonic() + 30
        while proc.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.returncode == 1 and _refuses(proc.port)
        log = proc.log_path.read_text()
        assert (
            "AssertionError: served_model_name cannot contain a colon (':') character. The colon "
            "is reserved for the 'model:adapter' syntax used in LoRA adapter specification. "
            "Invalid value: 'org/drafter:v1'"
        ) in log
        assert "server_args=" not in log  # SGLang checks its arguments before logging them
    finally:
        proc.kill()
