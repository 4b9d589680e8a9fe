"""The DAG runs for real under ``airflow dags test`` (SQLite, its own Airflow home)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow-home")
    env = dict(os.environ, AIRFLOW_HOME=str(home), PYTHONPATH=str(ROOT))
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    env["AIRFLOW_BIN"] = airflow
    return env


def _dags_test(env: dict[str, str], conf: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [env["AIRFLOW_BIN"], "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        env=env, capture_output=True, text=True, timeout=600,
    )


def test_prepare_stage_runs_under_airflow_dags_test(airflow_env, tmp_path) -> None:
    proc = _dags_test(airflow_env, {"output_uri": str(tmp_path), "run_name": "it",
                                    "shard_size": 64})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "it" / "prompts" / "manifest.json").read_text())
    assert manifest["totals"]["kept"] > 0
    assert len(manifest["shards"]) == -(-manifest["totals"]["kept"] // 64)
    assert "prepare funnel" in proc.stdout + proc.stderr


def test_wrong_setting_fails_the_run_naming_it(airflow_env, tmp_path) -> None:
    proc = _dags_test(airflow_env, {"output_uri": str(tmp_path), "run_name": "bad",
                                    "sources": [{"name": "x", "path": str(tmp_path / "nope")}]})
    out = proc.stdout + proc.stderr
    assert "source 'x': path" in out and "does not exist" in out
    assert not (tmp_path / "bad" / "prompts" / "manifest.json").exists()
