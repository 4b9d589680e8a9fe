"""The DAG runs for real under ``airflow dags test`` (SQLite, its own Airflow home)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.ports import free_port_block
from tests.integration.conftest import dags_test

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"

pytestmark = pytest.mark.integration


def test_without_sglang_on_the_host_the_gate_fails_with_the_servers_log_tail(
    airflow_env, tmp_path
) -> None:
    # Local defaults: the prepare stage works; the GPU host (this machine) has no SGLang.
    proc = dags_test(airflow_env, {"output_uri": str(tmp_path), "run_name": "it",
                                   "shard_size": 64, "port_base": free_port_block(8),
                                   "server_log_dir": str(tmp_path / "logs")})
    out = proc.stdout + proc.stderr
    assert "state=failed" in out
    manifest = json.loads((tmp_path / "it" / "prompts" / "manifest.json").read_text())
    assert manifest["totals"]["kept"] > 0
    assert len(manifest["shards"]) == -(-manifest["totals"]["kept"] // 64)
    assert "prepare funnel" in out
    assert "exited before /health answered 200" in out
    assert "No module named 'sglang'" in out  # the log tail, fetched from the host
    assert not (tmp_path / "it" / "generated").exists()


def test_wrong_setting_fails_the_run_naming_it(airflow_env, tmp_path) -> None:
    proc = dags_test(airflow_env, {"output_uri": str(tmp_path), "run_name": "bad",
                                    "sources": [{"name": "x", "path": str(tmp_path / "nope")}]})
    out = proc.stdout + proc.stderr
    assert "source 'x': path" in out and "does not exist" in out
    assert not (tmp_path / "bad" / "prompts" / "manifest.json").exists()
