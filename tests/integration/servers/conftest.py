"""Fixtures for the servers tier: a real sshd, a stand-in tokenizer and launch settings.

Every server a test launches is stopped at teardown, whatever the test did, through the same
pid files the launcher writes, so no stand-in outlives the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from include.servers.commands import ServerPaths
from include.servers.hosts import LocalRunner
from include.servers.lifecycle import build_stop_command
from include.settings import RunSettings
from sglang_standin.process import shell_launch_command
from tests.fixtures.ports import free_port_block
from tests.fixtures.settings import run_settings
from tests.fixtures.sshd import SshdServer, sshd  # noqa: F401 - the fixture is used by name

ROOT = Path(__file__).resolve().parents[3]

# The stand-in takes SGLang's flags; these make it fast and keep it offline.
STANDIN_COMMAND = shell_launch_command()
FAST_ARGS = ["--standin-warmup-seconds", "0.5", "--standin-zero-latency"]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sglang_standin.tokenizer import build_chat_tokenizer

    return build_chat_tokenizer(tmp_path_factory.mktemp("tok") / "small")


SettingsFactory = Callable[..., RunSettings]


@pytest.fixture
def make_settings(
    tokenizer_dir: Path,
    tmp_path: Path,
    sshd: SshdServer,  # noqa: F811
) -> Iterator[SettingsFactory]:
    """Return a factory of launch settings for stand-ins on localhost over real SSH.

    The factory takes run settings (a mapping) and deployment settings (keywords) apart, as
    production does; ``hosts`` overrides the GPU hosts (default: one host over SSH with GPUs
    0 and 1). The factory's port block is fixed per test, so relaunches reach the same servers.
    """
    base = free_port_block(4)
    log_dir = tmp_path / "server logs"
    used: list[int] = []

    def factory(run: dict[str, Any] | None = None, *,
                hosts: list[dict[str, Any]] | None = None, **deployment: Any) -> RunSettings:
        hosts = hosts or [{"host": "127.0.0.1", "ssh_conn_id": sshd.conn_id, "gpus": [0, 1]}]
        run = {"model_path": str(tokenizer_dir), "served_model_name": "standin-qwen",
               "context_length": 4096, "max_tokens": 1024, "launch_timeout_s": 60,
               **(run or {})}
        deployment = {"gpu_hosts": hosts, "port_base": base, "server_log_dir": str(log_dir),
                      "server_launch_command": STANDIN_COMMAND, "extra_server_args": FAST_ARGS,
                      **deployment}
        settings = run_settings(run, **deployment)
        used.extend(g for h in settings.deployment.gpu_hosts for g in h.gpus)
        return settings

    yield factory
    # Whatever happened in the test, stop every server on the block through its pid file.
    runner = LocalRunner()
    for gpu in sorted(set(used)):
        runner.execute(build_stop_command(ServerPaths(str(log_dir), base + gpu), grace_s=5))
