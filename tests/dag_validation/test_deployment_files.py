"""The deployment files agree with each other and with what the DAG needs.

Static checks only (no Docker engine): docker-compose.yaml is parsed with PyYAML, anchors and
merge keys resolved, and checked for the services, mounts and variables the DAG relies on;
.env.example must document every variable the compose file reads; the Dockerfile's base image
must be the Airflow version requirements.txt pins. The native tier (scripts/deploy.py, what
`./dev up` and tests/deployment/ start) must give its components what compose gives its
services: deploy/airflow.env for both, and the same keys for everything else.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from dotenv import dotenv_values

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
SHARED_ENV_FILE = "deploy/airflow.env"
DOCKERFILE = ROOT / "Dockerfile"
REQUIREMENTS = ROOT / "requirements.txt"

AIRFLOW_HOME = "/opt/airflow"
CODE_DIRS = ("dags", "include", "plugins")
AIRFLOW_SERVICES = {"api-server", "scheduler", "dag-processor", "triggerer", "worker"}
#: Deployment settings a deployment must state (the rest may keep DeploymentSettings' defaults).
REQUIRED_DEPLOYMENT_SETTINGS = (
    "output_root", "gpu_hosts", "allowed_models", "data_roots", "protected_prefixes",
    "sglang_conn_id", "max_active_shards", "defer_health_gate",
)
#: Set by compose for one service only, with what the native tier does instead.
COMPOSE_ONLY = {
    "DUMB_INIT_SETSID": "the image's init; each native component is a session of its own",
    "_AIRFLOW_DB_MIGRATE": "the image's entrypoint; scripts/deploy.py runs `airflow db migrate`",
    "_AIRFLOW_WWW_USER_CREATE": "the image's entrypoint; scripts/deploy.py runs `users create`",
    "_AIRFLOW_WWW_USER_USERNAME": "the admin user scripts/deploy.py creates",
    "_AIRFLOW_WWW_USER_PASSWORD": "generated once into var/deploy/tier.json",
}
# `${NAME}`, `${NAME:-default}`, `${NAME:?error}`, ...; `$${NAME}` is an escaped literal.
_VAR_RE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")


# --- helpers ------------------------------------------------------------------------------
def compose_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the services, each with its anchors and `<<` merges already resolved."""
    return compose["services"]


def env_files(service: dict[str, Any]) -> list[str]:
    """Return the env files a service reads (short or long syntax)."""
    files = service.get("env_file") or []
    files = [files] if isinstance(files, str) else files
    return [f["path"] if isinstance(f, dict) else f for f in files]


def is_airflow_service(service: dict[str, Any]) -> bool:
    """Whether a service runs the Airflow image (it reads the shared Airflow env file)."""
    return SHARED_ENV_FILE in env_files(service)


def read_env_file(path: Path) -> dict[str, str]:
    """Return an env file's assignments, literally (no interpolation), as compose reads it."""
    return {k: v or "" for k, v in dotenv_values(path, interpolate=False).items()}


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    """Return what a container gets: its env files, then `environment:` over them."""
    env: dict[str, str] = {}
    for name in env_files(service):
        env.update(read_env_file(ROOT / name))
    env.update({k: str(v) for k, v in (service.get("environment") or {}).items()})
    return env


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
    assert service_environment(triggerer)["PYTHONPATH"] == AIRFLOW_HOME
    assert (ROOT / "include" / "servers" / "triggers.py").is_file()


def test_celery_executor_with_redis_and_postgres(airflow_services) -> None:
    for name, svc in airflow_services.items():
        env = service_environment(svc)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://"), name
        assert "@postgres/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
        assert env["PYTHONPATH"] == AIRFLOW_HOME, name
    assert airflow_services["worker"]["command"] == "celery worker"


def test_airflow_services_share_one_secret_set(airflow_services) -> None:
    # Tasks authenticate to the API server with JWTs: every component needs the same secret.
    shared = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY")
    for key in shared:
        values = {service_environment(svc).get(key) for svc in airflow_services.values()}
        assert len(values) == 1 and None not in values, f"{key} differs between services"


def test_connections_and_deployment_settings_reach_the_containers(airflow_services) -> None:
    # The dag-processor too: it parses the DAG, which reads the last two settings.
    for name in ("worker", "triggerer", "dag-processor"):
        env = service_environment(airflow_services[name])
        for key in (
            "AIRFLOW_CONN_GPU_HOST_SSH",
            "AIRFLOW_CONN_AWS_DEFAULT",
            "AIRFLOW_CONN_SGLANG_DEFAULT",
            "HF_TOKEN",
            *(f"REGEN_{s.upper()}" for s in REQUIRED_DEPLOYMENT_SETTINGS),
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


# --- compose and the native tier in step ---------------------------------------------------
@pytest.fixture
def native_tier(tmp_path: Path):
    """A native tier with made-up ports and secrets, configured but never started."""
    from scripts.deploy import Tier

    tier = Tier(tmp_path, api_port=18080)
    ports = {n: 20000 + i for i, n in enumerate(
        ["postgres", "redis", "s3", "ssh", "scheduler_health", "triggerer_logs",
         "worker-1_logs", "worker-2_logs", "port_base"])}
    tier.config = {"admin_user": "admin", "ports": {**ports, "api": 18080},
                   "secrets": {k: f"secret-{k}" for k in (
                       "postgres_password", "fernet_key", "jwt_secret", "api_secret_key",
                       "admin_password", "s3_password", "sglang_api_key")}}
    (tmp_path / "connections.json").write_text(json.dumps({"ssh": "{}", "s3": "{}"}))
    return tier


def test_every_airflow_service_reads_the_shared_env_file(services) -> None:
    # Anything with a database URL is an Airflow service, whatever else it sets.
    for name, svc in services.items():
        if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in (svc.get("environment") or {}):
            assert env_files(svc) == [SHARED_ENV_FILE], f"{name} reads {env_files(svc)}"


def test_shared_env_file_is_literal_and_overridden_nowhere(airflow_services, native_tier) -> None:
    from scripts.deploy import WORKERS

    shared = read_env_file(ROOT / SHARED_ENV_FILE)
    assert shared.get("AIRFLOW__CORE__EXECUTOR") == "CeleryExecutor"
    assert "FabAuthManager" in shared.get("AIRFLOW__CORE__AUTH_MANAGER", "")
    # The native tier reads it without interpolation: a ${...} would reach Airflow verbatim.
    assert not [k for k, v in shared.items() if "$" in v], "deploy/airflow.env interpolates"
    for name, svc in airflow_services.items():
        overridden = set(shared) & set(svc.get("environment") or {})
        assert not overridden, f"compose's {name} overrides {sorted(overridden)}"
    for component in ("api-server", *WORKERS):
        native = {**native_tier.deployment_environment({"ssh": "", "s3": ""}),
                  **native_tier.native_environment(component)}
        assert not set(shared) & set(native), f"the native {component} overrides it"
        env = native_tier.component_environment(component)
        assert {k: env[k] for k in shared} == shared


def test_native_tier_sets_every_key_compose_sets(airflow_services, native_tier) -> None:
    from scripts.deploy import NATIVE_ONLY

    native = set(native_tier.deployment_environment({"ssh": "", "s3": ""}))
    common = set(airflow_services["scheduler"]["environment"])
    assert native == common, (f"only compose: {sorted(common - native)}; "
                              f"only native: {sorted(native - common)}")
    for name, svc in airflow_services.items():
        extra = set(svc["environment"]) - common
        assert extra <= set(COMPOSE_ONLY), f"{name} sets {sorted(extra - set(COMPOSE_ONLY))}"
    assert not set(NATIVE_ONLY) & (common | set(read_env_file(ROOT / SHARED_ENV_FILE)))


def test_native_only_settings_are_the_declared_ones(native_tier) -> None:
    from scripts.deploy import COMMANDS, NATIVE_ONLY

    for component in COMMANDS:
        undeclared = set(native_tier.native_environment(component)) - set(NATIVE_ONLY)
        assert not undeclared, f"{component}: {sorted(undeclared)} not in NATIVE_ONLY"


def test_nothing_of_the_callers_environment_reaches_a_component(native_tier, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
    monkeypatch.setenv("REGEN_PORT_BASE", "1")
    env = native_tier.component_environment("scheduler")
    assert "AIRFLOW__CORE__UNIT_TEST_MODE" not in env
    assert env["REGEN_PORT_BASE"] == "20008"


def test_native_components_run_what_compose_services_run(airflow_services) -> None:
    from scripts.deploy import COMMANDS, WORKERS

    compose = {name: airflow_services[name]["command"].split() for name in AIRFLOW_SERVICES}
    for name, command in compose.items():
        native = [c for c in COMMANDS.values() if c[:len(command)] == command]
        assert native, f"no native component runs compose's {name}: {' '.join(command)}"
    for name, command in COMMANDS.items():
        assert any(command[:len(c)] == c for c in compose.values()), name
    assert len(WORKERS) >= 2 and all(COMMANDS[w][:2] == ["celery", "worker"] for w in WORKERS)


def test_compose_deployment_settings_are_known_and_their_defaults_agree(
    airflow_services, monkeypatch
) -> None:
    from include.settings import DeploymentSettings, env_name

    env = airflow_services["scheduler"]["environment"]
    fields = DeploymentSettings.model_fields
    regen = {k: v for k, v in env.items() if k.startswith("REGEN_")}
    unknown = sorted(set(regen) - {env_name(f) for f in fields})
    assert not unknown, f"compose sets REGEN_* that are no deployment setting: {unknown}"
    for setting in REQUIRED_DEPLOYMENT_SETTINGS:
        assert env_name(setting) in regen, f"compose does not set {env_name(setting)}"
    for key, value in regen.items():
        default = re.fullmatch(rf"\$\{{{key}:-(.*)\}}", value)
        if default:  # compose's fallback must be DeploymentSettings' own default
            setting = key.removeprefix("REGEN_").lower()
            monkeypatch.setenv(key, default.group(1))
            got = getattr(DeploymentSettings(), setting)
            monkeypatch.delenv(key)
            assert got == fields[setting].get_default(call_default_factory=True), key
        else:
            assert re.fullmatch(rf"\$\{{{key}:\?.+\}}", value), f"{key}: {value}"


def test_env_example_deployment_settings_are_valid(monkeypatch) -> None:
    from include.settings import DeploymentSettings

    example = read_env_file(ENV_EXAMPLE)
    for key, value in example.items():
        if key.startswith("REGEN_"):
            monkeypatch.setenv(key, value)
    settings = DeploymentSettings.load()
    settings.check()
    assert settings.output_root.startswith("s3://")
    for host in settings.gpu_hosts:
        assert f"AIRFLOW_CONN_{host.ssh_conn_id.upper()}" in example, host


def test_servers_api_key_is_the_password_of_the_sglang_connection(
    airflow_services, native_tier
) -> None:
    env = airflow_services["worker"]["environment"]
    conn_id = re.fullmatch(r"\$\{REGEN_SGLANG_CONN_ID:-(.+)\}", env["REGEN_SGLANG_CONN_ID"])
    assert conn_id, env["REGEN_SGLANG_CONN_ID"]
    key = f"AIRFLOW_CONN_{conn_id.group(1).upper()}"
    assert re.fullmatch(rf"\$\{{{key}:\?.+\}}", env.get(key, "")), f"compose: {env.get(key)}"
    native = native_tier.deployment_environment({"ssh": "", "s3": ""})
    assert native["REGEN_SGLANG_CONN_ID"] == conn_id.group(1)
    assert json.loads(native[key])["password"] == native_tier.config["secrets"]["sglang_api_key"]


def test_obsolete_monitor_variables_are_gone(compose_text: str) -> None:
    for text in (compose_text, ENV_EXAMPLE.read_text()):
        assert "REGEN_MONITOR_" not in text


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


def test_the_native_api_server_reaches_each_workers_log_server(native_tier, monkeypatch) -> None:
    # Issue 27: every running task's log said "Could not read served logs ... Failed to
    # resolve 'worker-1' ... port=8793": the workers' names resolve nowhere, their ports differ.
    from types import SimpleNamespace

    from scripts.deploy import WORKERS
    from scripts.deploy_logs import LOG_SERVERS_ENV, NativeTierTaskHandler

    api = native_tier.component_environment("api-server")
    assert api["AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS"] == "scripts.deploy_logs.LOGGING_CONFIG"
    monkeypatch.setenv(LOG_SERVERS_ENV, api[LOG_SERVERS_ENV])
    handler = NativeTierTaskHandler("/tmp")
    for worker in WORKERS:
        env = native_tier.component_environment(worker)
        reported = env["DEPLOY_WORKER_NAME"]  # what the hostname callable returns there
        ti = SimpleNamespace(hostname=reported, triggerer_job=None)
        url, _ = handler._get_log_retrieval_url(ti, "dag_id=d/attempt=1.log")
        assert url == (f"http://127.0.0.1:{env['AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT']}"
                       "/log/dag_id=d/attempt=1.log")
    # A host it does not list (compose's containers) keeps Airflow's own URL.
    url, _ = handler._get_log_retrieval_url(SimpleNamespace(hostname="abc123"), "x.log")
    assert url.startswith("http://abc123:")


def test_both_tiers_let_the_same_roles_see_the_run_monitor(airflow_services) -> None:
    # Issue 27: a non-admin user met no "Drafter data runs" in the Browse menu (the plugins
    # list, which the UI builds its menu from, is Admin-only in FAB).
    from scripts.deploy import PLUGIN_VIEW_ROLES

    init = "\n".join(airflow_services["airflow-init"]["command"])
    grant = f"airflow roles add-perms {' '.join(PLUGIN_VIEW_ROLES)} -r Plugins -a can_read"
    assert grant in init
    assert set(PLUGIN_VIEW_ROLES) == {"Viewer", "User", "Op"}
