"""Shared test set-up: an isolated Airflow home and offline Hugging Face libraries.

Environment variables are set here, before anything imports airflow, so that no test touches
a real Airflow home, a hub, or a network.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Deployment settings come from REGEN_* variables; a test sets the ones it needs, and none
# leaks in from the shell that started pytest.
for _name in [n for n in os.environ if n.startswith("REGEN_")]:
    del os.environ[_name]
os.environ["PYTHONPATH"] = str(ROOT) + (
    os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""
)


def pytest_configure(config) -> None:
    # Per tier: what runs, how long it takes, what skips for lack of sshd/Chromium/Postgres.
    from tests.fixtures.tiers import pytest_configure as register_tier_report

    register_tier_report(config)
