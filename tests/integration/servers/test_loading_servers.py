"""A server still loading its model (alive, port closed) is used and waited for, not failed.

Real SGLang opens its port only once the weights are loaded and the CUDA graphs captured
(minutes for a 27B model): the process lives and connections are refused. The stand-in's
``--standin-load-seconds`` keeps its port closed that long, over the real sshd.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from include.servers.launcher import launch_servers, stop_servers
from include.servers.sensor import ServerHealthSensor, ServerNotReadyError
from include.settings import RunSettings
from tests.integration.servers.conftest import FAST_ARGS
from tests.integration.servers.helpers import answers

SettingsFactory = Callable[..., RunSettings]

pytestmark = pytest.mark.integration

RUN_A, RUN_B = "regenerate_drafter_data/run A", "regenerate_drafter_data/backfill B"
#: Long enough for three launches over SSH on a loaded machine, short enough to stay cheap.
LOAD_S = 5


def gate(target: dict[str, Any], settings: RunSettings) -> dict[str, Any]:
    """Run one server's health gate in the worker (the DAG defers the same trigger)."""
    sensor = ServerHealthSensor(task_id=f"wait_{target['port']}", server=target,
                                settings=settings, deferrable=False, poke_interval=0.2,
                                process_check_interval=0.5)
    return sensor.execute({})


def test_loading_servers_are_leased_by_another_run_and_a_retry_then_gated(
    make_settings: SettingsFactory,
) -> None:
    hosts = [{"host": "127.0.0.1", "ssh_conn_id": "ssh_loopback", "gpus": [0, 1]}]
    loading_args = [*FAST_ARGS, "--standin-load-seconds", str(LOAD_S)]
    run_a = make_settings(hosts=hosts, extra_server_args=loading_args)
    a = launch_servers(run_a, owner=RUN_A)
    assert [s.action for s in a.servers] == ["started", "started"], a.summary()

    # Another run (which wants another context length, unknowable while loading) and a retry
    # of run A's launch task meet both servers loading: no wait, no failure, a lease each.
    other = make_settings({"context_length": 2048}, hosts=hosts, extra_server_args=loading_args)
    b = launch_servers(other, owner=RUN_B)
    retry = launch_servers(run_a, owner=RUN_A)
    assert not any(answers(url) for url in a.urls), "still loading: the test's premise"
    for report, ours in ((b, False), (retry, True)):
        assert [s.action for s in report.servers] == ["loading", "loading"], report.summary()
        assert [s.pid for s in report.servers] == [s.pid for s in a.servers]
        assert all(s.leased and s.started_by_this_run is ours for s in report.servers)
        assert report.problems == [] and report.urls == a.urls
        report.raise_for_problems()  # the DAG's health_targets task lets them through
    assert "loading its model" in b.servers[0].detail and RUN_A in b.servers[0].detail

    # GPU 0's process dies while loading: its gate fails at once, saying so.
    os.killpg(a.servers[0].pid, signal.SIGKILL)
    with pytest.raises(ServerNotReadyError, match="exited before /health answered 200"):
        gate(b.health_targets()[0], other)
    # GPU 1's gate waits for its port, then checks model name and context length.
    payload = gate(retry.health_targets()[1], run_a)
    assert payload["status"] == "success"
    assert payload["models"]["data"][0]["max_model_len"] == 4096
    with pytest.raises(ServerNotReadyError, match="max_model_len 4096.*`context_length` is 2048"):
        gate(b.health_targets()[1], other)

    # Run B's teardown releases its leases only; run A's stops both (the dead one is gone).
    first = stop_servers(b, other)
    assert first.stopped == [] and len(first.kept) == 2 and RUN_A in first.kept[1]
    last = stop_servers(retry, run_a)
    assert len(last.stopped) == 2 and last.left_behind == [] and last.kept == []
    assert not any(answers(url) for url in a.urls)
