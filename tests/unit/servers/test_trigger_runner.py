"""The health trigger runs host commands through the launcher's runner, nowhere else."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest

from include.servers.commands import ServerSpec
from include.servers.hosts import HostError
from include.servers.triggers import ServerHealthTrigger, run_host_command

ROOT = Path(__file__).resolve().parents[3]


def spec(ssh_conn_id: str | None = None, prefix: str | None = None) -> ServerSpec:
    return ServerSpec("127.0.0.1", 0, 30000, ssh_conn_id, "/nonexistent-dir",
                      command_prefix=prefix)


def test_a_local_command_runs_through_the_container_prefix() -> None:
    # The prefix's words come first: here they set a variable the command then prints.
    out = asyncio.run(run_host_command(spec(prefix="env REGEN_T=prefixed"), "echo $REGEN_T"))
    assert out.strip() == "prefixed"
    assert asyncio.run(run_host_command(spec(), "echo plain")).strip() == "plain"


def test_a_failing_command_names_the_server_and_its_exit_status() -> None:
    with pytest.raises(HostError, match=r"server 127\.0\.0\.1:30000.*exited with 3: oops"):
        asyncio.run(run_host_command(spec(), "echo oops >&2; exit 3"))


@pytest.mark.parametrize(("extra", "fragment"), [
    ({"key_file": "/nonexistent"}, "the host key is unknown"),
    ({"key_file": "/nonexistent", "host_key": "ssh-ed25519 AAAA", "no_host_key_check": True},
     "sets `no_host_key_check`"),
])
def test_an_unpinned_host_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch, extra: dict, fragment: str
) -> None:
    # Port 9 on loopback: were a connection attempted it would fail with another message.
    conn = {"conn_type": "ssh", "host": "127.0.0.1", "port": 9, "login": "u", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_GPU_TRIGGER_TEST", json.dumps(conn))
    with pytest.raises(HostError, match=fragment.replace("`", ".")) as info:
        asyncio.run(run_host_command(spec("gpu_trigger_test"), "true"))
    assert "`gpu_trigger_test`" in str(info.value)


def test_the_trigger_module_has_no_runner_of_its_own() -> None:
    text = (ROOT / "include/servers/triggers.py").read_text()
    for other in ("create_subprocess", "SSHHook", "connection_problems", "apply_prefix"):
        assert other not in text, f"triggers.py uses {other}: run commands via servers.hosts"


def test_the_process_check_runs_on_the_host_and_sees_a_dead_server(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir(mode=0o700)
    s = ServerSpec("127.0.0.1", 0, 9, None, str(log_dir))  # nothing listens on port 9
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    Path(s.paths.pid_file).write_text(dead + "\n")
    Path(s.paths.log_file).write_text("Traceback: CUDA out of memory\n")
    trigger = ServerHealthTrigger(server=s.to_dict(), expected={"model_name": "m",
                                  "context_length": 4096}, deadline=2**40)

    async def once(check_process: bool) -> dict:
        async with aiohttp.ClientSession() as session:
            return await trigger.check_once(session, check_process=check_process)

    assert asyncio.run(once(False))["status"] == "waiting"
    payload = asyncio.run(once(True))
    assert payload["status"] == "error", payload
    assert f"its process {dead}" in payload["message"]
    assert "CUDA out of memory" in payload["message"]  # the log tail, read the same way
