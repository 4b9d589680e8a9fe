"""The real-server tier's set-up: SGLang 0.5.23 itself, served on this CPU, started once.

Two real servers (``.venv-sglang``, ``scripts/sglang_env.py``; the tiny Qwen3 of
``scripts/tiny_qwen3.py``) are launched the way a deployment launches them: by the product's
own launcher (``include.servers.launcher.launch_servers``) over the test sshd, with
``server_launch_command`` and ``extra_server_args`` set as a CPU host's deployment sets them.
They start once for the tier (2-4 minutes) and hold the tier's lease; the DAG runs of the tier
reuse them (the launcher reuses servers that serve the run's model) and release only their own
lease. Each server writes its own request log into its server log (SGLang's
``--log-requests --log-requests-level 3 --log-requests-format json``): the prompt ids and sampled
ids it handled, recorded by the server, not by our client.

The contract suite (``test_contract.py``) also runs every behaviour against a stand-in serving
the same model directory (its tokenizer and template), so the two answer side by side.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts import sglang_env
from tests.fixtures.ports import free_port_block
from tests.fixtures.sshd import SshdServer, sshd  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "Qwen/Qwen3-8B"
TIER_OWNER = "tests/real_sglang"
GPUS = (0, 1)
#: ``REAL_SGLANG_KEEP=1`` (development): the servers live in var/real-sglang/servers on fixed
#: ports and are left running after the tier, so the next run's launcher finds and reuses them
#: (as it reuses any server serving the run's model) instead of waiting minutes for a start-up.
KEEP_ENV = "REAL_SGLANG_KEEP"
KEEP_DIR = ROOT / "var" / "real-sglang" / "servers"
KEEP_PORT_BASE = 31000
#: Start-up measured here: 112 s quiet, up to 6.5 min at load average 28.
READY_TIMEOUT_S = 900


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_sglang: runs against the released SGLang 0.5.23 serving on this CPU "
        "(tests/real_sglang/, in .venv-sglang)")


@pytest.fixture(scope="session")
def real_model() -> Path:
    """Return the tiny model's directory, building the SGLang environment first if needed."""
    try:
        return sglang_env.build()
    except sglang_env.SglangEnvError as exc:
        message = f"the real SGLang cannot be set up here: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI never passes by skipping the tier
        pytest.skip(message)


@dataclass
class RealDeployment:
    """The tier's CPU host as a deployment describes it, and the run settings it serves."""

    deployment: dict[str, Any]
    run: dict[str, Any]
    log_dir: Path
    urls: list[str] = field(default_factory=list)

    def server_logs(self) -> list[Path]:
        """Return each server's log (the launcher's ``server-<port>.log``), current and previous."""
        return sorted(self.log_dir.glob("server-*.log*"))

    def finished_requests(self) -> list[dict[str, Any]]:
        """Return every ``request.finished`` record the servers logged (their own ids)."""
        return sglang_env.finished_requests(self.server_logs())


@pytest.fixture(scope="session")
def real_deployment(real_model: Path, sshd: SshdServer,  # noqa: F811
                    tmp_path_factory: pytest.TempPathFactory) -> RealDeployment:
    """Return the deployment and run settings of the tier's two CPU servers."""
    if os.environ.get(KEEP_ENV):
        log_dir, base = KEEP_DIR, KEEP_PORT_BASE
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = tmp_path_factory.mktemp("real-servers")
        base = free_port_block(max(GPUS) + 1)
    deployment = {
        "gpu_hosts": [{"host": "127.0.0.1", "ssh_conn_id": sshd.conn_id, "gpus": list(GPUS)}],
        "port_base": base,
        "server_launch_command": sglang_env.launch_command(),
        "extra_server_args": [*sglang_env.CPU_SERVER_ARGS, *sglang_env.REQUEST_LOG_ARGS],
        "server_log_dir": str(log_dir),
    }
    run = {
        "model_path": str(real_model),
        "served_model_name": SERVED_NAME,
        "context_length": sglang_env.CONTEXT_LENGTH,
        "reasoning_parser": "qwen3",
        "launch_timeout_s": READY_TIMEOUT_S,
        "mem_fraction_static": 0.8,
    }
    urls = [f"http://127.0.0.1:{base + g}" for g in GPUS]
    return RealDeployment(deployment, run, log_dir, urls)


def get_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET ``url``; return (status, parsed body or text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body


def wait_ready(urls: list[str], logs: Path, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Wait until every server lists its model; return the seconds waited. Fail with log tails."""
    started = time.monotonic()
    waiting = list(urls)
    while waiting:
        for url in list(waiting):
            try:
                status, _ = get_json(url + "/v1/models", timeout=5)
            except OSError:
                continue
            if status == 200:
                waiting.remove(url)
        if waiting and time.monotonic() - started > timeout_s:
            tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                              for p in sorted(logs.glob("server-*.log")))
            pytest.fail(f"real SGLang servers {waiting} not ready after {timeout_s:.0f} s:\n"
                        f"{tails}")
        if waiting:
            time.sleep(2)
    return time.monotonic() - started


@pytest.fixture(scope="session")
def real_servers(real_deployment: RealDeployment) -> Iterator[RealDeployment]:
    """Launch the two real servers through the product's launcher; stop them after the tier."""
    from include.servers.launcher import launch_servers, stop_servers
    from tests.fixtures.settings import run_settings

    settings = run_settings(real_deployment.run, **real_deployment.deployment)
    report = launch_servers(settings, owner=TIER_OWNER)
    report.raise_for_problems()
    waited = wait_ready(real_deployment.urls, real_deployment.log_dir)
    print(f"\nreal SGLang: {len(real_deployment.urls)} servers ready after {waited:.0f} s")
    try:
        yield real_deployment
    finally:
        if not os.environ.get(KEEP_ENV):
            stop_servers(report, settings)


def server_pids() -> list[int]:
    """Return every live process of a real SGLang server started as this tier starts them.

    SGLang runs three processes a server (HTTP, scheduler, detokenizer), the last two with
    other command lines; all inherit the launch command's ``SGLANG_USE_CPU_ENGINE=1``.
    """
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"SGLANG_USE_CPU_ENGINE=1" in environ:
            pids.append(int(proc.name))
    return pids
