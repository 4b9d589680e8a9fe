"""The deployment of docker-compose.yaml, started natively on this machine (no Docker engine).

``./dev up`` / ``./dev down`` / ``./dev status`` call this module. It starts, in the
background, what compose runs: Postgres, Redis, the S3 endpoint (moto's server mode in place
of MinIO), ``airflow db migrate`` and the admin user (compose's ``airflow-init``), the
api-server, scheduler, dag-processor, triggerer and two Celery workers, plus the "GPU host":
a real sshd on loopback where the DAG's launcher starts the stand-in SGLang servers
(``sglang_standin.switchboard``: time-compressed, faults switched by ``Tier.set_faults``).
State lives in ``var/deploy/`` (``--state``): one log and one pid file per component,
``tier.json`` with ports and generated secrets (kept across ``up``/``down``, so the database
and logins survive).

Every Airflow component gets the same environment as in compose: ``deploy/airflow.env``
(compose's ``env_file:``) plus ``deployment_environment()``, which sets the keys compose's
``environment:`` sets, with this machine's values; ``NATIVE_ONLY`` lists, with reasons, what a
container gets from its image or its own hostname instead.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from include.dag_names import DAG_ID
from scripts.deploy_api import unix_time
from scripts.deploy_services import (
    DeployError,
    Processes,
    free_port_block,
    postgres_dir,
    s3_connection,
    start_postgres,
    start_redis,
    start_s3,
    start_sshd,
    stop_standins,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED_ENV = ROOT / "deploy" / "airflow.env"
DEFAULT_STATE = ROOT / "var" / "deploy"
AIRFLOW = str(Path(sys.executable).parent / "airflow")
BUCKET = "drafter-data"
SSH_CONN_ID = "gpu_host_ssh"
SGLANG_CONN_ID = "sglang_default"
GPUS = [0, 1, 2]
#: The stand-ins answer ~50x faster than a real model would (demo-like pace on 2 cores).
STANDIN_ARGS = ["--enable-metrics", "--standin-time-scale", "0.02",
                "--standin-median-output-tokens", "150", "--standin-warmup-seconds", "0.5"]
SERVED_MODEL = "Qwen/Qwen3.6-27B"
WORKERS = ("worker-1", "worker-2")
#: FAB roles that see the run monitor in the UI's Browse menu (its plugin entry needs "can
#: read on Plugins", which FAB gives Admin only); compose's airflow-init grants the same.
PLUGIN_VIEW_ROLES = ("Viewer", "User", "Op")
#: compose's `command:` of each Airflow service, and the native components running it.
COMMANDS = {"api-server": ["api-server"], "scheduler": ["scheduler"],
            "dag-processor": ["dag-processor"], "triggerer": ["triggerer"],
            **{w: ["celery", "worker", "--celery-hostname", f"{w}@%h"] for w in WORKERS}}
#: Set natively only, and why (what a container gets from its image or its hostname instead).
NATIVE_ONLY = {
    "AIRFLOW_HOME": "the image's /opt/airflow",
    "AIRFLOW__CORE__DAGS_FOLDER": "the image's default, where compose mounts ./dags",
    "AIRFLOW__CORE__PLUGINS_FOLDER": "the image's default, where compose mounts ./plugins",
    "AIRFLOW__API__HOST": "compose publishes the port on BIND_ADDRESS",
    "AIRFLOW__API__PORT": "compose publishes 8080 as AIRFLOW_PORT",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": "each container has its own 8974",
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": "each container has its own 8794",
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": "each container has its own 8793",
    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "each worker container has its own hostname",
    "DEPLOY_WORKER_NAME": "the worker's name, read by that hostname callable",
    "AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS": "the API server reaches each worker's log server "
    "by its container's hostname on 8793 (natively: scripts/deploy_logs.py)",
    "DEPLOY_WORKER_LOG_SERVERS": "each worker's log server port, read by that log handler",
    "HF_HUB_OFFLINE": "this machine reaches no model hub",
    "HF_DATASETS_OFFLINE": "this machine reaches no model hub",
    "PATH": "the image's PATH",
}


def shared_environment() -> dict[str, str]:
    """Return ``deploy/airflow.env``, literally (the file has no interpolation)."""
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(SHARED_ENV, interpolate=False).items()
            if v is not None}


@dataclass
class Tier:
    """One native deployment: its state directory, ports and secrets."""

    state: Path = DEFAULT_STATE
    api_port: int = 8080
    #: Extra environment for every Airflow component (tests compress time with it).
    overrides: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    #: Local directories a run may also read sources from, after the bundled samples and the
    #: model (benchmarks add the data they generate).
    extra_data_roots: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = Path(self.state).resolve()
        self.procs = Processes(self.state)
        self._log_sizes: dict[str, int] = {}

    # --- configuration ----------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.state / "tier.json"

    def configure(self) -> dict[str, Any]:
        """Pick this start's ports; create the secrets once (kept in ``tier.json``)."""
        from cryptography.fernet import Fernet

        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", self.api_port))
            except OSError:
                raise DeployError(f"port {self.api_port} (the UI and API) is in use: choose "
                                  "another with --port N") from None
        old = json.loads(self.config_file.read_text()) if self.config_file.exists() else {}
        kept = old.get("secrets") or {
            "postgres_password": secrets.token_hex(24),
            "fernet_key": Fernet.generate_key().decode(),
            "jwt_secret": secrets.token_hex(32),
            "api_secret_key": secrets.token_hex(32),
            "admin_password": secrets.token_urlsafe(12),
            "s3_password": secrets.token_hex(16),
            "sglang_api_key": secrets.token_hex(16),
        }
        for login in ("user", "viewer"):  # added later: a tier made before gets them now
            kept.setdefault(f"{login}_password", secrets.token_urlsafe(12))
        names = ["postgres", "redis", "s3", "ssh", "scheduler_health", "triggerer_logs",
                 *(f"{w}_logs" for w in WORKERS)]
        base = free_port_block(len(names) + len(GPUS))
        ports = {name: base + i for i, name in enumerate(names)}
        ports["port_base"] = base + len(names)  # the stand-ins: GPU i on port_base + i
        ports["api"] = self.api_port
        self.config = {"secrets": kept, "ports": ports, "admin_user": "admin"}
        self.state.mkdir(parents=True, exist_ok=True)
        _write_private(self.config_file, json.dumps(self.config, indent=2) + "\n")
        return self.config

    def load(self) -> dict[str, Any]:
        if not self.config:
            if not self.config_file.exists():
                raise DeployError(f"no tier in {self.state} (./dev up starts one)")
            self.config = json.loads(self.config_file.read_text())
            self.api_port = self.config["ports"]["api"]
        return self.config

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.load()['ports']['api']}"

    @property
    def model_dir(self) -> Path:
        """The stand-ins' "model" on the GPU host: a tokenizer directory."""
        return self.state / "gpu-host" / "model"

    @property
    def server_log_dir(self) -> Path:
        return self.state / "gpu-host" / "servers"

    @property
    def fault_file(self) -> Path:
        """The file the GPU host's stand-ins take their faults from (none while absent)."""
        return self.state / "gpu-host" / "faults.json"

    def set_faults(self, **faults: Any) -> None:
        """Switch the stand-ins' faults (``sglang_standin.switchboard``); none: all off."""
        from sglang_standin.switchboard import write_faults

        write_faults(self.fault_file, **faults)

    def api(self) -> Any:
        from scripts.deploy_api import AirflowApi

        c = self.load()
        return AirflowApi(self.url, c["admin_user"], c["secrets"]["admin_password"]).login()

    def run_conf(self, **overrides: Any) -> dict[str, Any]:
        """Return a trigger conf that fits this tier (the stand-ins' model, short prompts)."""
        return {"run_name": "native-demo", "model_path": str(self.model_dir),
                "served_model_name": SERVED_MODEL, "context_length": 8192, "max_tokens": 2048,
                "shard_size": 50, "launch_timeout_s": 120, "progress_interval_s": 5,
                "health_interval_s": 1, **overrides}

    # --- environments -----------------------------------------------------------------
    def deployment_environment(self, connections: dict[str, str]) -> dict[str, str]:
        """Return what compose's ``environment:`` gives every Airflow service, for here."""
        c = self.load()
        s, p = c["secrets"], c["ports"]
        db = f"airflow:{s['postgres_password']}@127.0.0.1:{p['postgres']}/airflow"
        return {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql://{db}",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://:@127.0.0.1:{p['redis']}/0",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4",
            "AIRFLOW__CORE__FERNET_KEY": s["fernet_key"],
            "AIRFLOW__API_AUTH__JWT_SECRET": s["jwt_secret"],
            "AIRFLOW__API__SECRET_KEY": s["api_secret_key"],
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "PYTHONPATH": str(ROOT),
            "AIRFLOW_CONN_GPU_HOST_SSH": connections["ssh"],
            "AIRFLOW_CONN_AWS_DEFAULT": connections["s3"],
            "AIRFLOW_CONN_SGLANG_DEFAULT": json.dumps(
                {"conn_type": "generic", "password": s["sglang_api_key"]}),
            "HF_TOKEN": "",
            "HF_HOME": str(self.state / "hf-cache"),
            "REGEN_OUTPUT_ROOT": f"s3://{BUCKET}/runs",
            "REGEN_GPU_HOSTS": json.dumps(
                [{"host": "127.0.0.1", "ssh_conn_id": SSH_CONN_ID, "gpus": GPUS}]),
            "REGEN_ALLOWED_MODELS": json.dumps([str(self.model_dir)]),
            "REGEN_DATA_ROOTS": json.dumps([str(ROOT / "include" / "sample_data"),
                                            str(self.model_dir), *self.extra_data_roots]),
            "REGEN_PROTECTED_PREFIXES": json.dumps(["completions/"]),
            "REGEN_ALLOWED_DRAFTERS": "{}",
            "REGEN_ALLOWED_PROMPT_SETS": "{}",
            "REGEN_SGLANG_CONN_ID": SGLANG_CONN_ID,
            "REGEN_MAX_ACTIVE_SHARDS": "3",
            "REGEN_DEFER_HEALTH_GATE": "true",
            "REGEN_S3_CONN_ID": "aws_default",
            "REGEN_SERVER_LAUNCH_COMMAND": switchboard_launch_command(),
            "REGEN_EXTRA_SERVER_ARGS": json.dumps(
                [*STANDIN_ARGS, "--standin-fault-file", str(self.fault_file)]),
            "REGEN_PORT_BASE": str(p["port_base"]),
            "REGEN_SERVER_LOG_DIR": str(self.server_log_dir),
        }

    def native_environment(self, component: str) -> dict[str, str]:
        """Return the settings ``NATIVE_ONLY`` names, for ``component``."""
        p = self.load()["ports"]
        env = {
            "AIRFLOW_HOME": str(self.state / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(p["api"]),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(p["scheduler_health"]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(p["triggerer_logs"]),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if component == "api-server":  # it reads a running task's log from its worker
            env["AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS"] = "scripts.deploy_logs.LOGGING_CONFIG"
            env["DEPLOY_WORKER_LOG_SERVERS"] = json.dumps({w: p[f"{w}_logs"] for w in WORKERS})
        if component in WORKERS:
            env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(p[f"{component}_logs"])
            env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = "scripts.deploy_hostname.worker_hostname"
            env["DEPLOY_WORKER_NAME"] = component
        return env

    def component_environment(self, component: str) -> dict[str, str]:
        """Return the whole environment of one Airflow component."""
        connections = json.loads((self.state / "connections.json").read_text())
        # Nothing of the caller's Airflow, Hugging Face or REGEN_ set-up leaks in (./dev's
        # .airflow home, pytest's unit-test mode): a container starts from its image alone.
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("AIRFLOW", "REGEN_", "HF_", "TRANSFORMERS_", "TOKENIZERS_",
                                     "PYTHON", "VIRTUAL_ENV", "_AIRFLOW"))}
        return {**base, **shared_environment(), **self.deployment_environment(connections),
                **self.native_environment(component), **self.overrides}

    # --- lifecycle --------------------------------------------------------------------
    def up(self, log=print) -> None:
        """Start every component (or raise DeployError naming the one that failed)."""
        if any(self.procs.pid(n) for n in self.procs.names()):
            raise DeployError(f"a tier is already running from {self.state}: ./dev down first")
        c = self.configure()
        s, p = c["secrets"], c["ports"]
        t0 = time.monotonic()
        log(f"postgres :{p['postgres']}, redis :{p['redis']}, S3 :{p['s3']}, "
            f"GPU host sshd :{p['ssh']} (state in {self.state})")
        start_postgres(self.procs, self.state, p["postgres"], s["postgres_password"])
        start_redis(self.procs, self.state, p["redis"])
        s3_url = start_s3(self.procs, p["s3"], BUCKET, "regen", s["s3_password"])
        connections = {"ssh": start_sshd(self.procs, self.state, p["ssh"]),
                       "s3": s3_connection(s3_url, "regen", s["s3_password"])}
        _write_private(self.state / "connections.json", json.dumps(connections))
        from sglang_standin.tokenizer import build_chat_tokenizer

        build_chat_tokenizer(self.model_dir, context_length=8192)
        services = time.monotonic() - t0
        log("airflow db migrate, logins (compose's airflow-init)")
        self._init_airflow()
        init = time.monotonic() - t0 - services
        self._log_sizes = {w: _size(self.procs.log(w)) for w in WORKERS}
        started = time.time()
        for name in COMMANDS:
            self.start_component(name)
        # The same checks as compose's healthchecks, where an HTTP one exists.
        for name in COMMANDS:
            self.wait_component_healthy(name, since=self._log_sizes.get(name, 0), after=started)
        total = time.monotonic() - t0
        # Each part, so a slow start says where (a busy machine slows every Airflow start-up).
        log(f"all components up in {total:.0f} s (services {services:.0f} s, database and logins "
            f"{init:.0f} s, Airflow's components {total - services - init:.0f} s)")

    def start_component(self, name: str) -> int:
        """Start one Airflow component (again); return its pid."""
        return self.procs.start(name, [AIRFLOW, *COMMANDS[name]],
                                env=self.component_environment(name), cwd=self.state)

    def restart_component(self, name: str, *, kill: bool = True) -> float:
        """Stop one Airflow component (SIGKILL to its whole session, as a crash, unless not
        ``kill``), start it again and wait until it is healthy; return when it was stopped
        (``time.time()``)."""
        since = _size(self.procs.log(name))
        if kill:
            self.procs.kill(name)
        self.procs.stop(name, timeout=60 if name in WORKERS else 30)
        stopped = time.time()
        self.start_component(name)
        self.wait_component_healthy(name, since=since, after=stopped)
        return stopped

    def wait_worker_ready(self, name: str, since: int = 0, timeout: float = 180.0) -> None:
        """Wait until worker ``name`` logs that it is ready (after byte ``since`` of its log)."""
        def ready() -> bool:
            with open(self.procs.log(name), "rb") as f:
                f.seek(since)
                return f"{name}@".encode() in (text := f.read()) and b" ready." in text

        wait_until(ready, "'ready.' in its log", self.procs, name, timeout=timeout)

    def wait_component_healthy(self, name: str, since: int = 0, after: float = 0.0,
                               timeout: float = 180.0) -> None:
        """Wait for compose's healthcheck of component ``name``: a worker's ready line after
        byte ``since`` of its log; the dag-processor's and triggerer's heartbeat after Unix
        time ``after`` (a restarted one's, not its predecessor's)."""
        if name in WORKERS:
            self.wait_worker_ready(name, since=since, timeout=timeout)
            return
        p = self.load()["ports"]

        def get(url: str) -> bytes:
            with urllib.request.urlopen(url, timeout=5) as answer:  # raises unless 2xx
                return answer.read()

        def beating(key: str) -> bool:
            health = json.loads(get(f"{self.url}/api/v2/monitor/health"))[key]
            beat = health.get(f"latest_{key}_heartbeat")
            return health["status"] == "healthy" and unix_time(beat) > after

        if name == "api-server":
            wait_until(lambda: get(f"{self.url}/api/v2/version") is not None,
                       "/api/v2/version", self.procs, name, timeout=timeout)
        elif name == "scheduler":
            wait_until(lambda: get(f"http://127.0.0.1:{p['scheduler_health']}/health")
                       is not None, "/health", self.procs, name, timeout=timeout)
        else:
            key = name.replace("-", "_")
            wait_until(lambda: beating(key), "a healthy heartbeat", self.procs, name,
                       timeout=timeout)

    def _airflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AIRFLOW, *args], env=self.component_environment("init"),
                              cwd=self.state, capture_output=True, text=True, check=False)

    def _init_airflow(self) -> None:
        done = self._airflow("db", "migrate")
        self.procs.logs.mkdir(parents=True, exist_ok=True)
        with open(self.procs.log("airflow-init"), "a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode:
            raise DeployError(f"airflow db migrate failed:\n{(done.stdout + done.stderr)[-3000:]}")
        # The logins and the monitor's grant in one process: what compose's airflow-init does
        # with `users create` and `roles add-perms`, without two more Airflow start-ups
        # (~6 s each on an idle 2-core machine, 20 s on a busy one).
        spec = {"logins": self.logins(), "plugin_view_roles": list(PLUGIN_VIEW_ROLES)}
        done = subprocess.run([str(Path(AIRFLOW).with_name("python")), "-c", _LOGINS],
                              input=json.dumps(spec),
                              env=self.component_environment("init"), cwd=self.state,
                              capture_output=True, text=True, check=False)
        with open(self.procs.log("airflow-init"), "a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode:
            raise DeployError(f"creating the logins, or letting {PLUGIN_VIEW_ROLES} see the run "
                              f"monitor, failed:\n{(done.stdout + done.stderr)[-3000:]}")

    def logins(self) -> list[dict[str, str]]:
        """Return the tier's logins: the admin, and a User and a Viewer to try the UI as a
        person who triggers runs, or only reads them, would."""
        c = self.load()
        return [{"username": name, "role": role, "password": c["secrets"][f"{key}_password"]}
                for name, role, key in ((c["admin_user"], "Admin", "admin"),
                                        ("user", "User", "user"), ("viewer", "Viewer", "viewer"))]

    def status(self) -> dict[str, int | None]:
        return {name: self.procs.pid(name) for name in self.procs.names()}

    def down(self, log=print) -> None:
        """Stop everything this tier started: Airflow first, then what it stands on."""
        for name in [*WORKERS, "triggerer", "scheduler", "dag-processor", "api-server"]:
            if self.procs.pid(name):
                log(f"stopping {name}")
            self.procs.stop(name, timeout=60 if name in WORKERS else 30)
        left = stop_standins(self.server_log_dir)
        if left:
            log(f"stopped stand-in servers a run left running: pids {left}")
        for name in ("gpu-host-sshd", "s3", "redis"):
            self.procs.stop(name)
        self.procs.stop("postgres", signal.SIGINT)  # SIGINT: Postgres's fast shutdown
        for name in self.procs.names():  # anything else a test started under this tier
            self.procs.stop(name)


#: Run with the tier's Airflow environment, the logins as JSON on stdin: creates each login
#: that does not exist yet and grants the roles the plugins list (the monitor's menu entry),
#: as `airflow users create` and `airflow roles add-perms` do (FAB's own calls).
_LOGINS = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
spec = json.load(sys.stdin)
with get_application_builder() as appbuilder:
    sm = appbuilder.sm
    for u in spec["logins"]:
        if sm.find_user(u["username"]):
            print(f"{u['username']} already exists")
        elif not sm.add_user(u["username"], u["username"].title(), "User",
                             f"{u['username']}@localhost", sm.find_role(u["role"]),
                             u["password"]):
            sys.exit(f"creating the login {u['username']} failed")
        else:
            print(f"created {u['username']} ({u['role']})")
    grant = sm.create_permission("can_read", "Plugins")
    for name in spec["plugin_view_roles"]:
        role = sm.find_role(name)
        if grant not in role.permissions:
            sm.add_permission_to_role(role, grant)
            print(f"{name} may read Plugins")
"""


def remove_database(tier: Tier) -> None:
    """Delete a stopped tier's Postgres cluster (it may live outside the state directory)."""
    if any(tier.status().values()):
        raise DeployError(f"the tier in {tier.state} is running: ./dev down first")
    shutil.rmtree(postgres_dir(tier.state), ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds secrets), from its first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def switchboard_launch_command() -> str:
    """Return the stand-ins' launch command: ``sglang_standin.switchboard`` (fault file)."""
    from sglang_standin.process import shell_launch_command

    return shell_launch_command(module="sglang_standin.switchboard")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _summary(tier: Tier) -> str:
    conf = tier.state / "run-conf.json"
    conf.write_text(json.dumps(tier.run_conf(), indent=2) + "\n")
    return "\n".join([
        f"Airflow UI:  {tier.url}  (logins: "
        + ", ".join(f"{u['username']} / {u['password']} ({u['role']})" for u in tier.logins())
        + ")",
        f"DAG:         {DAG_ID} (paused until you unpause it, as in compose); the trigger "
        "form's defaults run on the stand-ins",
        f"run monitor: {tier.url}/regen-monitor/ (Browse -> Drafter data runs)",
        f"run conf:    {conf}  (the stand-ins' model; paste it into the trigger form's JSON)",
        f"logs:        {tier.procs.logs}/<component>.log; task logs in "
        f"{tier.state / 'airflow' / 'logs'}",
        "stop:        ./dev down",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The compose deployment, natively.")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--port", type=int, default=8080, help="API server / UI port")
    args = parser.parse_args(argv)
    tier = Tier(args.state, api_port=args.port)
    try:
        if args.action == "up":
            try:
                tier.up()
            except BaseException:
                print(f"stopping what started; logs stay in {tier.procs.logs}", file=sys.stderr)
                tier.down(log=lambda _msg: None)
                raise
            try:
                tier.api().wait_for_dag(DAG_ID, timeout=120)
            except Exception as exc:  # noqa: BLE001 - the tier is up; the DAG is the user's
                print(f"warning: the DAG is not loaded: {exc}", file=sys.stderr)
            print(_summary(tier))
        elif args.action == "down":
            tier.down()
        else:
            status = tier.status()
            for name, pid in status.items():
                print(f"{name:15} {'running, pid ' + str(pid) if pid else 'stopped'}")
            if not any(status.values()):
                print(f"nothing running from {tier.state} (./dev up starts the tier)")
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
