"""The one-shard CLI runs the same checks and opens the store the same way as the DAG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.settings import deployment_env

ROOT = Path(__file__).resolve().parents[3]


def _cli(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGEN_")}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "include.pipeline.shard_cli", "--shard", "shard-00000",
         "--servers", "http://127.0.0.1:9", *args],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_cli_refuses_a_protected_output_location_and_writes_nothing(tmp_path) -> None:
    root = tmp_path / "completions"
    proc = _cli(deployment_env({"output_root": str(root)}), "--set", "run_name=x")
    assert proc.returncode == 2, proc.stderr
    assert "protected prefix" in proc.stderr and "`run_name`" in proc.stderr
    assert not root.exists()


def test_cli_refuses_deployment_settings_given_as_run_settings(tmp_path) -> None:
    proc = _cli(deployment_env({"output_root": str(tmp_path)}),
                "--set", "server_launch_command=sh -c id", "--set", "protected_prefixes=[]")
    assert proc.returncode == 2
    assert "`server_launch_command` is a deployment setting" in proc.stderr
    assert "`protected_prefixes` is a deployment setting" in proc.stderr
    assert list(tmp_path.iterdir()) == []
