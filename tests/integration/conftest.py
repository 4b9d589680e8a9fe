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

    ``conf`` is a flat mapping as a test writes it: its deployment settings become the
    ``REGEN_*`` environment of the run and the rest its trigger conf, unless ``raw`` (then the
    conf goes to the trigger as it is, e.g. to show deployment settings in it are refused).
    """
    from tests.fixtures.settings import deployment_env, split

    run, dep = (dict(conf), {}) if raw else split(conf)
    dep.update(deployment or {})
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
