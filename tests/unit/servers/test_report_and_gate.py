"""Launch report data, the trigger's serialisation and the sensor's outcomes, without servers."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from include.servers.commands import ServerSpec, server_specs
from include.servers.expectations import ModelExpectation
from include.servers.launch_report import LaunchError, LaunchReport, ServerOutcome
from include.servers.launcher import launch_servers, stop_servers
from include.servers.sensor import ServerHealthSensor, ServerNotReadyError
from include.servers.triggers import ServerHealthTrigger
from include.settings import RunSettings, SettingsError
from include.sglang.hook import SGLangHook
from sglang_standin.process import free_port
from tests.fixtures.settings import api_key_connection, run_settings

#: The deployment of the report below: one host over SSH, through a container prefix.
SETTINGS = run_settings(
    {"served_model_name": "qwen", "context_length": 32768, "launch_timeout_s": 1800},
    gpu_hosts=[{"host": "127.0.0.1", "ssh_conn_id": "ssh_gpu", "gpus": [0, 1, 2],
                "command_prefix": "nice -n 0"}],
    sglang_conn_id="sglang_prod")


def spec(port: int = 30000, gpu: int = 0) -> ServerSpec:
    return ServerSpec("127.0.0.1", gpu, port, "ssh_gpu", "/tmp/sglang-regen", "nice -n 0")


def report() -> LaunchReport:
    e = ModelExpectation.from_settings(SETTINGS)
    return LaunchReport(
        [
            ServerOutcome(spec(30000, 0), "started", True, 101, "log ...", leased=True),
            ServerOutcome(spec(30001, 1), "reused", False, 55, leased=True),
            ServerOutcome(spec(30002, 2), "mismatched", False, None, "", ["max_model_len 4096"]),
        ],
        e,
        1800.0,
        owner="dag/run",
        sglang_conn_id="sglang_prod",
    )


def test_report_is_json_data_and_round_trips() -> None:
    r = report()
    data = json.loads(json.dumps(r.to_dict()))
    back = LaunchReport.from_dict(data, SETTINGS)
    assert back == r
    assert [s.server.port for s in back.started] == [30000]
    assert [s.leased for s in back.servers] == [True, True, False]
    assert [s.server.port for s in back.problems] == [30002]
    assert back.urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    # The sensors get identifiers only; they rebuild expectation, timeout and key connection.
    assert back.health_targets() == [{"host": "127.0.0.1", "port": p} for p in (30000, 30001,
                                                                                 30002)]
    assert back.idents == back.health_targets()[:2]
    assert "api_key" not in json.dumps(data)
    assert "30002 (GPU 2): mismatched: max_model_len 4096" in r.summary()


def test_raise_for_problems_lists_each_bad_server() -> None:
    with pytest.raises(LaunchError, match="30002 \\(GPU 2\\): max_model_len 4096"):
        report().raise_for_problems()


def test_a_remote_host_without_a_key_is_refused_before_any_ssh() -> None:
    s = run_settings(
        gpu_hosts=[{"host": "gpu-a.invalid", "ssh_conn_id": "no_such_conn", "gpus": [0]}])
    assert s.api_key is None
    # Any SSH attempt would fail with HostError naming the connection; this fails first.
    with pytest.raises(SettingsError, match="gpu-a.invalid listen on the network") as err:
        launch_servers(s)
    assert "REGEN_SGLANG_CONN_ID" in str(err.value) and "REGEN_GPU_HOSTS" in str(err.value)


def test_stop_skips_servers_this_run_neither_started_nor_leased() -> None:
    r = report()
    r.servers = [s for s in r.servers if not (s.started_by_this_run or s.leased)]
    out = stop_servers(r.to_dict(), SETTINGS)
    assert out.stopped == [] and out.left_behind == [] and len(out.skipped) == 1


def trigger(port: int, **kwargs: Any) -> ServerHealthTrigger:
    s = ServerSpec("127.0.0.1", 0, port, None, "/nonexistent-dir")
    return ServerHealthTrigger(
        server=s.to_dict(),
        expected=ModelExpectation("qwen", 4096, max_tokens=1024).to_dict(),
        deadline=kwargs.pop("deadline", time.time() + 60),
        **kwargs,
    )


def test_trigger_serialises_to_its_include_classpath_without_the_key() -> None:
    conn_id = api_key_connection("sk-never-serialised")
    t = trigger(30000, sglang_conn_id=conn_id, poke_interval=2)
    path, kwargs = t.serialize()
    assert path == "include.servers.triggers.ServerHealthTrigger"
    assert "sk-never-serialised" not in json.dumps(kwargs)
    again = ServerHealthTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)
    # The key is read from the connection when the trigger runs (in the triggerer).
    assert asyncio.run(again.api_key()) == "sk-never-serialised"
    assert asyncio.run(SGLangHook("sglang_test_missing").async_api_key()) is None


def test_trigger_gives_up_at_the_deadline_with_the_log_note() -> None:
    port = free_port()  # nothing listens: connection refused counts as "not yet"
    t = trigger(port, deadline=time.time() + 0.6, poke_interval=0.1, process_check_interval=0)

    async def first() -> dict[str, Any]:
        async for event in t.run():
            return event.payload
        raise AssertionError

    started = time.monotonic()
    payload = asyncio.run(first())
    assert 0.5 < time.monotonic() - started < 5
    assert payload["status"] == "error"
    assert "not healthy after" in payload["message"] and "`launch_timeout_s`" in payload["message"]
    assert f"server-{port}.log" in payload["message"]


def local_settings(port: int, run: dict[str, Any] | None = None) -> RunSettings:
    """Return ``run`` on a deployment whose one server is ``127.0.0.1:port``, without SSH."""
    return run_settings(run, gpu_hosts=[{"host": "127.0.0.1", "gpus": [0]}], port_base=port,
                        server_log_dir="/nonexistent-dir")


def sensor(port: int, settings: RunSettings | None = None, **kwargs: Any) -> ServerHealthSensor:
    return ServerHealthSensor(task_id="wait_for_server", server={"host": "127.0.0.1", "port": port},
                              settings=settings or local_settings(port), **kwargs)


def test_sensor_defers_to_the_trigger_while_the_server_is_down() -> None:
    port = free_port()
    settings = local_settings(port, {"launch_timeout_s": 300, "served_model_name": "qwen"})
    s = sensor(port, settings, poke_interval=1)
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({})
    t = deferred.value.trigger
    assert isinstance(t, ServerHealthTrigger)
    # Everything the trigger gets comes from the settings: server, timeout, model, key's name.
    assert t.sglang_conn_id == settings.deployment.sglang_conn_id
    assert t.server == server_specs(settings)[0].to_dict()
    assert t.expected == ModelExpectation.from_settings(settings).to_dict()
    assert 290 < t.deadline - time.time() <= 300
    assert deferred.value.method_name == "execute_complete"


def test_sensor_turns_an_error_event_into_a_clear_failure() -> None:
    s = sensor(30000)
    event = {"status": "error", "server": "127.0.0.1:30000 (GPU 0)", "url": "http://x",
             "message": "its process 12 exited\n--- last lines ---\nTraceback"}  # fmt: skip
    with pytest.raises(ServerNotReadyError, match="30000 \\(GPU 0\\).*is not ready: its process"):
        s.execute_complete({}, event)
    with pytest.raises(ServerNotReadyError, match="no event"):
        s.execute_complete({}, None)
    ok = {"status": "success", "server": "s", "message": "fine"}
    assert s.execute_complete({}, ok) is ok


def test_specs_from_settings_feed_the_sensor() -> None:
    s = run_settings(gpu_hosts=[{"host": "127.0.0.1", "gpus": [0, 1]}])
    targets = [x.ident for x in server_specs(s)]
    assert ServerHealthSensor(task_id="t", server=targets[1]).server["port"] == 30001
