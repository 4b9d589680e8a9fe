"""An Airflow home of its own (SQLite, migrated once per module) for ``airflow dags test``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "regenerate_drafter_data"


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Return the environment of a migrated Airflow home for this module's DAG runs."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = dict(os.environ, AIRFLOW_HOME=str(home), PYTHONPATH=str(ROOT))
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    env["AIRFLOW_BIN"] = airflow
    return env


def dags_test(env: dict[str, str], conf: dict, *, raw: bool = False,
              deployment: dict | None = None,
              extra_args: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the DAG once under ``airflow dags test``; return the finished process.

    As in production, ``conf`` is the trigger conf (run settings only: a deployment setting
    in it is a TypeError, unless ``raw``, which sends it unchecked, e.g. to show that the DAG
    refuses one) and ``deployment`` the deployment settings, the run's ``REGEN_*``
    environment; the deployment allows the run's model unless it says otherwise.
    """
    from tests.fixtures.settings import DEFAULT_MODEL, check_run_only, deployment_env

    run = dict(conf) if raw else check_run_only(conf, "dags_test")
    dep = dict(deployment or {})
    if not raw:
        dep.setdefault("allowed_models", [run.get("model_path") or DEFAULT_MODEL])
    env = {k: v for k, v in env.items() if not k.startswith("REGEN_")}
    env.update(deployment_env(dep))
    return subprocess.run(
        [env["AIRFLOW_BIN"], "dags", "test", DAG_ID, "-c", json.dumps(run), *(extra_args or [])],
        env=env, capture_output=True, text=True, timeout=900,
    )


def failure_excerpt(proc: subprocess.CompletedProcess) -> str:
    """Return the errors of the failed tasks in a ``dags test`` output (for assertion text)."""
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if "Task failed with exception" in line:
            keep += [ln for ln in lines[i:i + 60] if not ln.startswith("  ") or "include/" in ln]
    return "\n".join(keep[-120:]) or out[-4000:]
