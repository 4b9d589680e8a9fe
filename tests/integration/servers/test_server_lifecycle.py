"""Launch, gate, preflight and stop stand-in SGLang servers over a real SSH connection.

The stand-in is started exactly as a GPU host would start SGLang (same command builder, same
detached wrapper, same pid files), through a real sshd on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from include.servers.checks import ModelExpectation
from include.servers.launcher import (
    HostError,
    LaunchReport,
    launch_servers,
    probe_models,
    stop_servers,
)
from include.servers.preflight import PreflightError, format_table, preflight
from include.servers.sensor import ServerHealthSensor, ServerNotReadyError
from include.servers.triggers import ServerHealthTrigger
from include.settings import RunSettings

SettingsFactory = Callable[..., RunSettings]

pytestmark = pytest.mark.integration


def run_trigger(trigger: ServerHealthTrigger) -> dict[str, Any]:
    """Run a trigger like the triggerer does and return its one event's payload."""

    async def first() -> dict[str, Any]:
        events = [event.payload async for event in trigger.run()]
        assert len(events) == 1
        return events[0]

    return asyncio.run(first())


def sensor_for(target: dict[str, Any], **kwargs: Any) -> ServerHealthSensor:
    kwargs.setdefault("poke_interval", 0.2)
    kwargs.setdefault("process_check_interval", 0.5)
    return ServerHealthSensor(task_id=f"wait_{target['server']['port']}", **target, **kwargs)


def refuses(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, OSError):
        return True
    return False


def test_cold_start_gate_reuse_preflight_and_teardown(make_settings: SettingsFactory) -> None:
    # A harmless real container prefix: every remote command runs through `nice -n 0 sh -c`.
    settings = make_settings(
        hosts=[
            {"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0, 1],
             "command_prefix": "nice -n 0"}
        ],
        api_key="sk-test",
    )  # fmt: skip
    report = launch_servers(settings, owner="regenerate/run-1")
    assert [s.action for s in report.servers] == ["started", "started"], report.summary()
    assert all(s.pid for s in report.started)
    targets = report.to_dict()["health_targets"]

    # Cold start: the sensor finds the server loading and defers; the trigger then waits.
    first = sensor_for(targets[0])
    with pytest.raises(TaskDeferred) as deferred:
        first.execute({"params": {"api_key": "sk-test"}})
    payload = run_trigger(deferred.value.trigger)
    assert payload["status"] == "success", payload["message"]
    assert first.execute_complete({}, payload)["models"]["data"][0]["max_model_len"] == 4096
    # The non-deferrable mode runs the same checks in the worker.
    second = sensor_for(targets[1], deferrable=False, api_key="sk-test")
    assert second.execute({})["status"] == "success"

    # The 8192/8192 failure is caught at the gate, naming the setting to change.
    impossible = ModelExpectation("standin-qwen", 4096, max_tokens=4096).to_dict()
    with pytest.raises(ServerNotReadyError, match="lower max_tokens below"):
        sensor_for({**targets[0], "expected": impossible}, deferrable=False).execute(
            {"params": {"api_key": "sk-test"}}
        )

    # A second launch (another run) reuses both and owns neither.
    again = launch_servers(settings, owner="regenerate/run-2")
    assert [s.action for s in again.servers] == ["reused", "reused"]
    assert again.started == []
    assert stop_servers(again).stopped == []
    # A retry of the first run's launch task still owns its servers.
    retry = launch_servers(settings, owner="regenerate/run-1")
    assert [s.started_by_this_run for s in retry.servers] == [True, True]

    messages = [{"role": "user", "content": "Say hello."}]
    results = asyncio.run(
        preflight(report.urls, messages, 32, {"temperature": 0.6}, "standin-qwen", "sk-test", 30)
    )
    assert [r.context_length for r in results] == [4096, 4096]
    assert "standin-qwen" in format_table(results)
    with pytest.raises(PreflightError, match="exceeds the model's maximum context length"):
        asyncio.run(preflight(report.urls, messages, 4096, {}, "standin-qwen", "sk-test", 30))

    stopped = stop_servers(LaunchReport.from_dict(report.to_dict()))
    assert len(stopped.stopped) == 2 and stopped.left_behind == []
    assert all(refuses(url) for url in report.urls)


def test_mismatch_is_reported_and_replaced_only_when_asked(
    make_settings: SettingsFactory,
) -> None:
    one_gpu = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}]
    old = launch_servers(make_settings(hosts=one_gpu, context_length=4096), owner="old")
    old_pid = old.servers[0].pid
    assert old.servers[0].action == "started"
    assert _wait_answering(old.urls[0])

    wanted = make_settings(hosts=one_gpu, context_length=2048)
    kept = launch_servers(wanted, owner="new")
    (outcome,) = kept.servers
    assert outcome.action == "mismatched" and not outcome.started_by_this_run
    assert "max_model_len 4096" in outcome.differences[0]
    assert "`context_length` is 2048" in outcome.differences[0]
    assert "replace_mismatched_servers" in outcome.detail
    assert kept.urls == []

    replace = make_settings(hosts=one_gpu, context_length=2048, replace_mismatched_servers=True)
    new = launch_servers(replace, owner="new")
    (outcome,) = new.servers
    assert outcome.action == "replaced" and outcome.started_by_this_run
    assert outcome.pid != old_pid and outcome.differences
    payload = sensor_for(new.health_targets()[0], deferrable=False).execute({})
    assert payload["models"]["data"][0]["max_model_len"] == 2048
    assert stop_servers(new).left_behind == []


def _wait_answering(url: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe_models(url, None, 1).answering:
            return True
        time.sleep(0.1)
    return False


def test_server_that_exits_at_start_fails_with_its_log_tail(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(
        hosts=[{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}],
        model_path="/nonexistent/model-dir",
    )
    report = launch_servers(settings)
    assert report.servers[0].action == "started"
    target = report.health_targets()[0]
    started = time.monotonic()
    with pytest.raises(ServerNotReadyError) as err:
        sensor_for(target, deferrable=False).execute({})
    assert time.monotonic() - started < 30  # noticed by the pid check, not the 60 s deadline
    text = str(err.value)
    assert "127.0.0.1" in text and "exited before /health answered 200" in text
    assert "--- last 60 lines of" in text
    tail = text.split("--- last 60 lines of", 1)[1]
    assert "/nonexistent/model-dir" in tail  # the server's own complaint, from its log
    stopped = stop_servers(report)
    assert stopped.left_behind == [] and "not-running" in stopped.stopped[0]


def test_deadline_failure_carries_the_log_tail(make_settings: SettingsFactory) -> None:
    settings = make_settings(
        hosts=[{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0]}],
        extra_server_args=["--standin-warmup-seconds", "60"],
    )
    report = launch_servers(settings)
    target = {**report.health_targets()[0], "timeout_s": 4}
    with pytest.raises(ServerNotReadyError) as err:
        sensor_for(target, deferrable=False).execute({})
    text = str(err.value)
    assert "not healthy after" in text and "`launch_timeout_s`" in text
    assert "stand-in SGLang server" in text  # a line from the server's own log
    assert stop_servers(report).left_behind == []


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
    assert sensor_for(report.health_targets()[0], deferrable=False).execute({})["status"] == (
        "success"
    )
    assert len(stop_servers(report).stopped) == 1
    assert refuses(report.urls[0])
