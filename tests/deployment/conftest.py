"""One native deployment (scripts/deploy.py, what ``./dev up`` starts) for the whole tier.

Starting it takes half a minute or more on two cores, so it is started once for the tier's one
module and every scenario reuses it; a scenario that breaks a component (kills a worker)
restores it before it ends. It stops when the module ends, so no idle scheduler competes with
the tests that follow for the two cores. Runs are triggered through the REST API with the
admin's token, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from include.dag_names import DAG_ID
from scripts.deploy import Tier, remove_database
from scripts.deploy_api import AirflowApi
from scripts.deploy_services import free_port_block

#: Time compression for the faults (the only settings in which the tier differs from compose):
#: a task whose worker died is failed, and retried, after 40 s without a heartbeat, not 300 s;
#: a killed scheduler's or triggerer's work is taken over by its successor after 15 s without
#: a heartbeat (both beat every 5 s), not 30 s, and a restarted scheduler looks for tasks its
#: predecessor queued but never sent every 10 s, not every 300 s; a dead try's shard lease
#: expires after 20 s without a renewal, not 120 s.
TIME_COMPRESSION = {
    "REGEN_LEASE_TTL_S": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "40",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
}
#: Debian packages the tier needs (./dev setup installs them).
NEEDED = {"/usr/sbin/sshd": "openssh-server", "/usr/bin/redis-server": "redis-server"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deployment: the native deployment tier (Postgres, Redis, Celery workers, "
        "scheduler, triggerer, api-server; tests/deployment/)")


def _missing() -> list[str]:
    missing = [pkg for path, pkg in NEEDED.items() if not os.access(path, os.X_OK)]
    if not list(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        missing.append("postgresql")
    if shutil.which("ssh-keygen") is None:
        missing.append("openssh-client")
    return missing


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    """Start the whole deployment once; stop it after the module's last scenario."""
    missing = _missing()
    if missing:
        message = f"the deployment tier needs {missing}: run ./dev setup"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must never pass by skipping the tier
        pytest.skip(message)
    state = tmp_path_factory.mktemp("tier")
    deployment = Tier(state, api_port=free_port_block(), overrides=TIME_COMPRESSION)
    try:
        deployment.up(log=lambda msg: print(f"[tier] {msg}", flush=True))
        yield deployment
    finally:
        deployment.down(log=lambda msg: print(f"[tier] {msg}", flush=True))
        remove_database(deployment)  # root's clusters live in the postgres user's home


@pytest.fixture(autouse=True)
def no_faults_after(tier: Tier) -> Iterator[None]:
    """Switch the stand-ins' faults off after each scenario (``Tier.set_faults``)."""
    yield
    tier.set_faults()


@pytest.fixture(scope="module")
def api(tier: Tier) -> AirflowApi:
    """A client logged in with the admin's token, once the DAG is loaded."""
    client = tier.api()
    client.wait_for_dag(DAG_ID, timeout=180)
    return client


@pytest.fixture(scope="module")
def s3(tier: Tier) -> Any:
    """A boto3 client of the tier's S3 endpoint, with the deployment's credentials."""
    import boto3

    conn = json.loads(json.loads((tier.state / "connections.json").read_text())["s3"])
    return boto3.client("s3", endpoint_url=conn["extra"]["endpoint_url"],
                        region_name=conn["extra"]["region_name"],
                        aws_access_key_id=conn["login"], aws_secret_access_key=conn["password"])
