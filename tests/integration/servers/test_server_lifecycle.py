"""Launch, gate, preflight and stop stand-in SGLang servers over a real SSH connection.

The stand-in is started exactly as a GPU host would start SGLang (same command builder, same
detached wrapper, same pid files), through a real sshd on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from include.servers.expectations import ModelExpectation
from include.servers.first_requests import PreflightError, format_table, preflight
from include.servers.hosts import HostError
from include.servers.launch_report import LaunchReport
from include.servers.launcher import launch_servers, probe_models, stop_servers
from include.servers.sensor import ServerHealthSensor, ServerNotReadyError
from include.servers.triggers import ServerHealthTrigger
from include.settings import RunSettings
from tests.integration.servers.helpers import answers, wait_answering

SettingsFactory = Callable[..., RunSettings]

pytestmark = pytest.mark.integration


def run_trigger(trigger: ServerHealthTrigger) -> dict[str, Any]:
    """Run a trigger like the triggerer does and return its one event's payload."""

    async def first() -> dict[str, Any]:
        events = [event.payload async for event in trigger.run()]
        assert len(events) == 1
        return events[0]

    return asyncio.run(first())


def sensor_for(target: dict[str, Any], settings: RunSettings, **kwargs: Any
               ) -> ServerHealthSensor:
    """Return the gate of one server (its identifier, as XCom carries it) for ``settings``."""
    kwargs.setdefault("poke_interval", 0.2)
    kwargs.setdefault("process_check_interval", 0.5)
    return ServerHealthSensor(task_id=f"wait_{target['port']}", server=target,
                              settings=settings, **kwargs)


def processes_args() -> str:
    """Return every process's command line on this machine (the GPU host of these tests)."""
    # -ww: whole command lines, however long (ps cuts them to a width otherwise).
    done = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True)
    return done.stdout


def test_cold_start_gate_reuse_preflight_and_teardown(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # A harmless real container prefix: every remote command runs through `nice -n 0 sh -c`.
    key = "sk-test-" + uuid.uuid4().hex
    hosts = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0, 1],
              "command_prefix": "nice -n 0"}]
    settings = make_settings(hosts=hosts, api_key=key)
    caplog.set_level(logging.INFO)
    report = launch_servers(settings, owner="regenerate/run-1")
    assert [s.action for s in report.servers] == ["started", "started"], report.summary()
    assert all(s.pid for s in report.started)
    targets = report.health_targets()
    assert key not in json.dumps(report.to_dict())  # XCom holds no key, nor a connection's
    assert "nice -n 0" not in json.dumps(report.to_dict())  # nor a host fact

    # Cold start: the sensor finds the server loading and defers; the trigger then waits.
    first = sensor_for(targets[0], settings)
    with pytest.raises(TaskDeferred) as deferred:
        first.execute({})
    assert key not in json.dumps(deferred.value.trigger.serialize()[1])
    assert deferred.value.trigger.sglang_conn_id == settings.deployment.sglang_conn_id
    payload = run_trigger(deferred.value.trigger)
    assert payload["status"] == "success", payload["message"]
    assert first.execute_complete({}, payload)["models"]["data"][0]["max_model_len"] == 4096
    # The non-deferrable mode runs the same checks in the worker.
    second = sensor_for(targets[1], settings, deferrable=False)
    assert second.execute({})["status"] == "success"

    # The servers hold the key (a request without it is refused) and no command line has it.
    assert probe_models(report.urls[0], None).status == 401
    assert probe_models(report.urls[0], key).status == 200
    paths = [s.server.paths for s in report.servers]
    listing = processes_args()
    assert key not in listing and all(f"--config {p.config_file}" in listing for p in paths)
    for s in report.servers:  # nor their environment
        assert key.encode() not in Path(f"/proc/{s.pid}/environ").read_bytes()
    assert {os.stat(p.config_file).st_mode & 0o777 for p in paths} == {0o600}
    assert key not in caplog.text  # not logged either, masked or not

    # A wrong key is caught by the gate, naming the connection to fix.
    wrong_key = make_settings(hosts=hosts, api_key="sk-wrong-" + uuid.uuid4().hex)
    wrong = wrong_key.deployment.sglang_conn_id
    with pytest.raises(ServerNotReadyError, match=f"401 Unauthorized.*{wrong}"):
        sensor_for(targets[0], wrong_key, deferrable=False).execute({})

    # max_tokens at the context length is accepted: each request's budget keeps it safe.
    at_context = make_settings({"max_tokens": 4096}, hosts=hosts, api_key=key)
    assert ModelExpectation.from_settings(at_context).max_tokens == 4096
    assert sensor_for(targets[0], at_context, deferrable=False).execute({})

    # A second launch (another run) reuses both and leases them; its teardown keeps them.
    again = launch_servers(settings, owner="regenerate/run-2")
    assert [s.action for s in again.servers] == ["reused", "reused"]
    assert again.started == [] and all(s.leased for s in again.servers)
    released = stop_servers(again, settings)
    assert released.stopped == [] and len(released.kept) == 2
    assert "regenerate/run-1" in released.kept[0]
    # A retry of the first run's launch task still owns its servers.
    retry = launch_servers(settings, owner="regenerate/run-1")
    assert [s.started_by_this_run for s in retry.servers] == [True, True]

    messages = [{"role": "user", "content": "Say hello."}]
    results = asyncio.run(
        preflight(report.urls, messages, 32, {"temperature": 0.6}, "standin-qwen", key, 30)
    )
    assert [r.context_length for r in results] == [4096, 4096]
    assert "standin-qwen" in format_table(results)
    with pytest.raises(PreflightError, match="exceeds the model's maximum context length"):
        asyncio.run(preflight(report.urls, messages, 4096, {}, "standin-qwen", key, 30))

    stopped = stop_servers(LaunchReport.from_dict(report.to_dict(), settings), settings)
    assert len(stopped.stopped) == 2 and stopped.left_behind == []
    assert not any(answers(url) for url in report.urls)
    assert not [p for p in paths if os.path.exists(p.config_file)]  # the key file went too


def test_mismatch_is_reported_and_replaced_only_when_asked(
    make_settings: SettingsFactory,
) -> None:
    one_gpu = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}]
    # Launched without a run (no lease): nobody is using it, so it may be replaced.
    old = launch_servers(make_settings({"context_length": 4096}, hosts=one_gpu))
    old_pid = old.servers[0].pid
    assert old.servers[0].action == "started"
    assert wait_answering(old.urls[0])

    wanted = make_settings({"context_length": 2048}, hosts=one_gpu)
    kept = launch_servers(wanted, owner="new")
    (outcome,) = kept.servers
    assert outcome.action == "mismatched" and not outcome.started_by_this_run
    assert "max_model_len 4096" in outcome.differences[0]
    assert "`context_length` is 2048" in outcome.differences[0]
    assert "replace_mismatched_servers" in outcome.detail
    assert kept.urls == []

    replace = make_settings({"context_length": 2048, "replace_mismatched_servers": True},
                            hosts=one_gpu)
    new = launch_servers(replace, owner="new")
    (outcome,) = new.servers
    assert outcome.action == "replaced" and outcome.started_by_this_run
    assert outcome.pid != old_pid and outcome.differences
    payload = sensor_for(new.health_targets()[0], replace, deferrable=False).execute({})
    assert payload["models"]["data"][0]["max_model_len"] == 2048
    assert stop_servers(new, replace).left_behind == []


def test_server_that_exits_at_start_fails_with_its_log_tail_redacted(
    make_settings: SettingsFactory,
) -> None:
    key = "sk-in-the-log-" + uuid.uuid4().hex
    settings = make_settings(
        {"model_path": "/nonexistent/model-dir"},
        hosts=[{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}],
        api_key=key,
    )
    report = launch_servers(settings)
    assert report.servers[0].action == "started"
    target = report.health_targets()[0]
    started = time.monotonic()
    with pytest.raises(ServerNotReadyError) as err:
        sensor_for(target, settings, deferrable=False).execute({})
    assert time.monotonic() - started < 30  # noticed by the pid check, not the 60 s deadline
    text = str(err.value)
    assert "127.0.0.1" in text and "exited before /health answered 200" in text
    assert "--- last 60 lines of" in text
    tail = text.split("--- last 60 lines of", 1)[1]
    assert "/nonexistent/model-dir" in tail  # the server's own complaint, from its log
    # Like SGLang, the server logged its arguments with the key; the tail never carries it.
    assert key in Path(report.servers[0].server.paths.log_file).read_text()
    # v0.5.23 logs a dict (`'api_key': '...'`), v0.5.6 a repr (`api_key='...'`).
    assert re.search(r"api_key'?(=|: )'\*\*\*'", tail) and key not in text
    stopped = stop_servers(report, settings)
    assert stopped.left_behind == [] and "not-running" in stopped.stopped[0]


def test_deadline_failure_carries_the_log_tail(make_settings: SettingsFactory) -> None:
    hosts = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}]
    slow = ["--standin-warmup-seconds", "60"]
    settings = make_settings(hosts=hosts, extra_server_args=slow)
    report = launch_servers(settings)
    # The gate's timeout is the run's `launch_timeout_s` (never XCom's).
    short = make_settings({"launch_timeout_s": 4}, hosts=hosts, extra_server_args=slow)
    with pytest.raises(ServerNotReadyError) as err:
        sensor_for(report.health_targets()[0], short, deferrable=False).execute({})
    text = str(err.value)
    assert "not healthy after" in text and "`launch_timeout_s`" in text
    assert "server_args=" in text  # the first line of the server's own log
    assert stop_servers(report, settings).left_behind == []


@pytest.mark.parametrize(
    ("conn_attr", "fragments"),
    [
        ("unknown_host_conn_id", ["host key is unknown", "`host_key` extra", "ssh-keyscan"]),
        ("bad_key_conn_id", ["authentication failed", "`login`", "`key_file`"]),
    ],
)
def test_ssh_problems_fail_clearly(
    make_settings: SettingsFactory, sshd: Any, conn_attr: str, fragments: list[str]
) -> None:
    conn_id = getattr(sshd, conn_attr)
    settings = make_settings(hosts=[{"host": "127.0.0.1", "ssh_conn_id": conn_id, "gpus": [0]}])
    with pytest.raises(HostError) as err:
        launch_servers(settings, connect_attempts=1)
    text = str(err.value)
    assert f"SSH connection `{conn_id}`" in text
    for fragment in fragments:
        assert fragment in text


def test_local_host_without_ssh(make_settings: SettingsFactory) -> None:
    settings = make_settings(hosts=[{"host": "127.0.0.1", "gpus": [1]}])
    report = launch_servers(settings)
    assert report.servers[0].server.ssh_conn_id is None
    gate = sensor_for(report.health_targets()[0], settings, deferrable=False)
    assert gate.execute({})["status"] == "success"
    assert len(stop_servers(report, settings).stopped) == 1
    assert not answers(report.urls[0])
