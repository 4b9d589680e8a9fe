"""The deployment files agree with each other and with what the DAG needs.

Static checks only (no Docker engine): docker-compose.yaml is parsed with PyYAML, anchors and
merge keys resolved, and checked for the services, mounts and variables the DAG relies on;
.env.example must document every variable the compose file reads; the Dockerfile's base image
must be the Airflow version requirements.txt pins.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
REQUIREMENTS = ROOT / "requirements.txt"

AIRFLOW_HOME = "/opt/airflow"
CODE_DIRS = ("dags", "include", "plugins")
AIRFLOW_SERVICES = {"api-server", "scheduler", "dag-processor", "triggerer", "worker"}
# `${NAME}`, `${NAME:-default}`, `${NAME:?error}`, ...; `$${NAME}` is an escaped literal.
_VAR_RE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")


# --- helpers ------------------------------------------------------------------------------
def compose_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the services, each with its anchors and `<<` merges already resolved."""
    return compose["services"]


def is_airflow_service(service: dict[str, Any]) -> bool:
    """Whether a service runs the Airflow image (it carries the common Airflow environment)."""
    env = service.get("environment") or {}
    return isinstance(env, dict) and "AIRFLOW__CORE__EXECUTOR" in env


def mount_targets(service: dict[str, Any]) -> dict[str, str]:
    """Map each container path a service mounts to its host source (short or long syntax)."""
    targets: dict[str, str] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            targets[volume["target"]] = str(volume.get("source", ""))
        else:
            parts = str(volume).split(":")
            if len(parts) >= 2:
                targets[parts[1]] = parts[0]
    return targets


def missing_code_mounts(service: dict[str, Any]) -> list[str]:
    """Return the code directories a service does not mount from the project at /opt/airflow."""
    targets = mount_targets(service)
    missing = []
    for name in CODE_DIRS:
        source = targets.get(f"{AIRFLOW_HOME}/{name}")
        if source is None or source.rstrip("/") not in (f"./{name}", name):
            missing.append(name)
    return missing


def compose_variables(text: str) -> set[str]:
    """Return the names of the variables a compose file interpolates."""
    return set(_VAR_RE.findall(text))


def env_example_names(text: str) -> set[str]:
    """Return the variable names assigned in an env file (comments ignored)."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        names.add(line.split("=", 1)[0].removeprefix("export ").strip())
    return names


def dockerfile_base_image(text: str) -> str:
    """Return the image of the Dockerfile's last FROM line."""
    images = [line.split()[1] for line in text.splitlines() if line.upper().startswith("FROM ")]
    assert images, "the Dockerfile has no FROM line"
    return images[-1]


def pinned_version(requirements: str, package: str) -> str:
    """Return the version requirements.txt pins for `package` (`package==X`)."""
    match = re.search(rf"^{re.escape(package)}==([^\s;#]+)", requirements, re.MULTILINE)
    assert match, f"requirements.txt does not pin {package}"
    return match.group(1)


# --- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose_text() -> str:
    return COMPOSE.read_text()


@pytest.fixture(scope="module")
def compose(compose_text: str) -> dict[str, Any]:
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose_services(compose)


@pytest.fixture(scope="module")
def airflow_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services.items() if is_airflow_service(svc)}


# --- the compose file ---------------------------------------------------------------------
def test_all_airflow_components_are_present(airflow_services) -> None:
    missing = AIRFLOW_SERVICES - set(airflow_services)
    assert not missing, f"Airflow services missing from docker-compose.yaml: {sorted(missing)}"
    assert "airflow-init" in airflow_services


def test_backing_services_are_present(services) -> None:
    for name in ("postgres", "redis", "minio", "minio-init"):
        assert name in services, f"service {name!r} missing from docker-compose.yaml"


def test_every_airflow_service_mounts_dags_include_and_plugins(airflow_services) -> None:
    problems = {name: missing_code_mounts(svc) for name, svc in airflow_services.items()}
    problems = {name: dirs for name, dirs in problems.items() if dirs}
    assert not problems, f"services not mounting ./dags ./include ./plugins: {problems}"


def test_triggerer_can_import_the_health_trigger(airflow_services) -> None:
    triggerer = airflow_services["triggerer"]
    assert triggerer["command"] == "triggerer"
    assert mount_targets(triggerer).get(f"{AIRFLOW_HOME}/include") == "./include"
    assert triggerer["environment"]["PYTHONPATH"] == AIRFLOW_HOME
    assert (ROOT / "include" / "servers" / "triggers.py").is_file()


def test_celery_executor_with_redis_and_postgres(airflow_services) -> None:
    for name, svc in airflow_services.items():
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://"), name
        assert "@postgres/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
        assert env["PYTHONPATH"] == AIRFLOW_HOME, name
    assert airflow_services["worker"]["command"] == "celery worker"


def test_airflow_services_share_one_secret_set(airflow_services) -> None:
    # Tasks authenticate to the API server with JWTs: every component needs the same secret.
    shared = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY")
    for key in shared:
        values = {svc["environment"].get(key) for svc in airflow_services.values()}
        assert len(values) == 1 and None not in values, f"{key} differs between services"


def test_connections_and_dag_settings_reach_the_containers(airflow_services) -> None:
    for name in ("worker", "triggerer"):
        env = airflow_services[name]["environment"]
        for key in (
            "AIRFLOW_CONN_GPU_HOST_SSH",
            "AIRFLOW_CONN_AWS_DEFAULT",
            "HF_TOKEN",
            "REGEN_MAX_ACTIVE_SHARDS",
            "REGEN_DEFER_HEALTH_GATE",
        ):
            assert key in env, f"{name} lacks {key}"


def test_ssh_key_is_mounted_read_only_where_ssh_runs(airflow_services) -> None:
    for name in ("worker", "triggerer"):
        keys = [
            v
            for v in airflow_services[name].get("volumes") or []
            if isinstance(v, dict) and "ssh" in str(v.get("target", ""))
        ]
        assert keys, f"{name} does not mount the SSH key"
        assert all(k.get("read_only") is True for k in keys), f"{name}: SSH key not read-only"
    # The key is not handed to services that never open SSH connections.
    assert not any("ssh" in t for t in mount_targets(airflow_services["api-server"]))


def test_services_with_long_running_processes_have_healthchecks(services) -> None:
    for name in ("postgres", "redis", "minio", *sorted(AIRFLOW_SERVICES)):
        assert "healthcheck" in services[name], f"service {name!r} has no healthcheck"


def test_one_shot_services_gate_the_others(services) -> None:
    for name in AIRFLOW_SERVICES:
        condition = services[name]["depends_on"]["airflow-init"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_every_compose_variable_is_documented_in_env_example(compose_text: str) -> None:
    used = compose_variables(compose_text)
    documented = env_example_names(ENV_EXAMPLE.read_text())
    assert used, "no ${VAR} found in docker-compose.yaml: the pattern is broken"
    undocumented = sorted(used - documented)
    assert not undocumented, (
        f"variables used in docker-compose.yaml, not in .env.example: {undocumented}"
    )


def test_env_example_documents_each_variable_with_a_comment() -> None:
    lines = ENV_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#") and "=" in line:
            assert i > 0 and lines[i - 1].startswith("#"), f"no comment above: {line.split('=')[0]}"


# --- the Dockerfile ------------------------------------------------------------------------
def test_dockerfile_base_image_matches_the_airflow_pin() -> None:
    image = dockerfile_base_image(DOCKERFILE.read_text())
    version = pinned_version(REQUIREMENTS.read_text(), "apache-airflow")
    repository, _, tag = image.partition(":")
    assert repository == "apache/airflow"
    assert tag.split("-")[0] == version, f"base image {image} but requirements pin {version}"
    assert tag.endswith("-python3.11"), f"{image}: the project targets Python 3.11"


def test_dockerfile_installs_requirements_and_bakes_no_code() -> None:
    text = DOCKERFILE.read_text()
    assert "pip install --no-cache-dir -r" in text
    assert "requirements.txt" in text
    copied = [line.split() for line in text.splitlines() if line.startswith(("COPY", "ADD"))]
    sources = {word for parts in copied for word in parts[1:-1] if not word.startswith("--")}
    assert sources <= {"requirements.txt"}, f"the image must not bake in code: {sources}"


# --- the helpers themselves (so a broken helper cannot make the checks vacuous) -------------
def test_helpers_detect_what_they_should() -> None:
    service = {"volumes": ["./dags:/opt/airflow/dags:ro", "./include:/opt/airflow/include"]}
    assert missing_code_mounts(service) == ["plugins"]
    assert compose_variables("a: ${A:-x}\nb: $${B}\nc: ${C:?e} ${D}") == {"A", "C", "D"}
    assert env_example_names("# X=1\nY=2\n\nexport Z='{}'\n") == {"Y", "Z"}
    assert dockerfile_base_image("FROM a AS b\nRUN x\nFROM apache/airflow:1.2.3-python3.11\n") == (
        "apache/airflow:1.2.3-python3.11"
    )
    assert pinned_version("apache-airflow-core==9\napache-airflow==3.3.2\n", "apache-airflow") == (
        "3.3.2"
    )
    assert not is_airflow_service({"image": "postgres:16", "environment": {"POSTGRES_DB": "x"}})
