"""A GPU host's SSH connection must pin the host's key: the rule, and the runner enforcing it."""

from __future__ import annotations

import json

import pytest

from include.servers.hosts import HostError, SSHRunner, connection_problems, host_key_problems

PINNED = {"key_file": "/k", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"}


def test_a_pinned_host_key_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert host_key_problems("gpu", PINNED) == []
    # Read from the connection itself, as check_settings and the runner read it.
    monkeypatch.setenv("AIRFLOW_CONN_GPU_PINNED", json.dumps(
        {"conn_type": "ssh", "host": "h", "login": "u", "extra": PINNED}))
    assert connection_problems("gpu_pinned") == []
    assert "cannot read SSH connection `gpu_absent`" in connection_problems("gpu_absent")[0]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"key_file": "/k"}, "the host key is unknown"),
        ({**PINNED, "no_host_key_check": True}, "sets `no_host_key_check`"),
        ({**PINNED, "no_host_key_check": "true"}, "sets `no_host_key_check`"),
        ({**PINNED, "ignore_hostkey_verification": "True"}, "sets `no_host_key_check`"),
        ({**PINNED, "allow_host_key_change": "true"}, "sets `allow_host_key_change`"),
        ({**PINNED, "host_key": "  "}, "the host key is unknown"),
    ],
)
def test_a_connection_that_does_not_pin_the_key_is_refused(
        extra: dict, fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    problems = host_key_problems("gpu_a", extra)
    assert len(problems) == 1 and fragment in problems[0] and "`gpu_a`" in problems[0]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_A", json.dumps(
        {"conn_type": "ssh", "host": "h", "login": "u", "extra": extra}))
    assert connection_problems("gpu_a") == problems


def test_the_runner_refuses_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "ssh", "host": "10.0.0.9", "login": "u",
            "extra": {"key_file": "/nonexistent", "no_host_key_check": True}}
    monkeypatch.setenv("AIRFLOW_CONN_GPU_OPEN", json.dumps(conn))
    runner = SSHRunner("gpu_open", "10.0.0.9", connect_attempts=1)
    with pytest.raises(HostError, match="no_host_key_check"):
        runner.execute("true")
    assert runner._client is None  # nothing was sent anywhere
