"""Background processes of the native deployment tier, and the services Airflow stands on.

``Processes`` starts each component in its own session (so a signal to its process group
reaches everything it forked, like stopping a container), with its output in
``<state>/logs/<name>.log`` and ``<pid> <start time>`` in ``<state>/pids/<name>.pid``: a pid
file outliving its process never names an unrelated one. The start functions bring up what
docker-compose.yaml runs from images: Postgres and Redis from Debian's packages, an S3 endpoint
(moto's server mode, standing in for MinIO) and the "GPU host", a real sshd on loopback that
the DAG's launcher logs into to start the stand-in servers.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

POSTGRES_USER = "airflow"
POSTGRES_DB = "airflow"
REGION = "us-east-1"


class DeployError(RuntimeError):
    """A component could not be started; the message names it and quotes its log."""


def free_port_block(count: int = 1) -> int:
    """Return P with loopback ports P..P+count-1 free a moment ago.

    Taken below Linux's ephemeral range (32768-60999): a port from that range can be handed
    to an outgoing connection before the server meant for it binds it, and the tier's servers
    (the stand-ins above all) bind theirs long after this choice.
    """
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, 32768 - count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise DeployError(f"no {count} free consecutive loopback ports in 20000-32767")


def _stat(pid: int) -> list[str] | None:
    """Return the fields of /proc/<pid>/stat after the command name, or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """Return the process's start time (clock ticks since boot), or None if it is gone."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else fields[19]


def session_members(sid: int) -> list[int]:
    """Return the live processes of session ``sid`` (every process group in it)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[0] != "Z" and fields[3] == str(sid):
                members.append(int(entry.name))
    return members


class Processes:
    """Start, find and signal the tier's processes by name (pid files under ``state``)."""

    def __init__(self, state: Path) -> None:
        self.logs = state / "logs"
        self.pids = state / "pids"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], *,
              cwd: Path | None = None, user: str | None = None) -> int:
        """Start ``argv`` as component ``name`` in a new session; return its pid."""
        if self.pid(name):
            raise DeployError(f"{name} is already running (pid {self.pid(name)}); "
                              "stop it first (./dev down)")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with open(self.log(name), "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(argv)}\n"
                      .encode())
            log.flush()
            proc = subprocess.Popen(
                list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, **as_user(user))
        (self.pids / f"{name}.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
        return proc.pid

    def pid(self, name: str) -> int | None:
        """Return the live pid of component ``name``, or None."""
        try:
            pid_text, started = (self.pids / f"{name}.pid").read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_text)
        self._reap(pid)
        return pid if _start_time(pid) == started else None

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.pids.glob("*.pid")) if self.pids.is_dir() else []

    def send(self, name: str, sig: int) -> bool:
        """Send ``sig`` to component ``name``'s whole process group; return whether it ran."""
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process of ``name``'s session, as a container dies; return the pids.

        More than its process group: Airflow's task supervisor puts each task process in a
        group of its own, and a task must die with its worker's "machine".
        """
        pid = self.pid(name)
        if pid is None:
            return []
        killed = session_members(pid)
        for member in killed:
            try:
                os.kill(member, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.pid(name):
            time.sleep(0.05)
        return killed

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Signal ``name``'s group, wait up to ``timeout`` s, then SIGKILL what is left of its
        session (task processes in groups of their own included); drop its pid file."""
        pid = self.pid(name)
        if pid is not None and self.send(name, sig):
            deadline = time.monotonic() + timeout
            while self.pid(name) and time.monotonic() < deadline:
                time.sleep(0.2)
        if pid is not None:
            self.kill(name)
            for member in session_members(pid):  # outlived their leader
                try:
                    os.kill(member, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        (self.pids / f"{name}.pid").unlink(missing_ok=True)

    @staticmethod
    def _reap(pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child (started by an earlier `./dev up`): init reaps it


def as_user(user: str | None) -> dict[str, object]:
    """Return the Popen arguments that run a child as ``user`` (its own group, no others)."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def wait_until(check: Callable[[], bool], what: str, procs: Processes, name: str,
               timeout: float = 120.0) -> None:
    """Poll ``check`` until true; raise DeployError with ``name``'s log if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet, whatever the client says
            pass
        if procs.pid(name) is None:
            raise DeployError(f"{name} exited before {what}; its log "
                              f"({procs.log(name)}):\n{procs.tail(name)}")
        time.sleep(0.3)
    raise DeployError(f"{name}: no {what} within {timeout:.0f} s; its log "
                      f"({procs.log(name)}):\n{procs.tail(name)}")


# --- Postgres -----------------------------------------------------------------------------
def _postgres_bin(tool: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if not found:
        raise DeployError(f"PostgreSQL's {tool} is not installed: run ./dev setup (it installs "
                          "Debian's postgresql package)")
    return str(found[-1])


def _traversable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents] if p.exists())


def postgres_dir(state: Path) -> Path:
    """Return the cluster directory: in ``state``, unless root must hand it to ``postgres``
    and a parent directory would keep that user out (then in that user's home)."""
    d = state / "postgres"
    if os.geteuid() == 0 and not _traversable_by_others(state):
        import hashlib

        tag = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:10]
        d = Path(pwd.getpwnam("postgres").pw_dir) / f"regen-deploy-{tag}"
    return d


def start_postgres(procs: Processes, state: Path, port: int, password: str) -> str:
    """Start (initialising once) the metadata database; return its SQLAlchemy URL."""
    d = postgres_dir(state)
    data, run = d / "data", d / "run"
    # Postgres refuses to run as root: as root, the cluster belongs to Debian's postgres user.
    user = "postgres" if os.geteuid() == 0 else None
    run.mkdir(parents=True, exist_ok=True)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(d, entry.pw_uid, entry.pw_gid)
        os.chown(run, entry.pw_uid, entry.pw_gid)
    if not (data / "PG_VERSION").exists():
        pwfile = d / "pwfile"
        pwfile.write_text(password + "\n")
        if user:
            os.chown(pwfile, pwd.getpwnam(user).pw_uid, -1)
        try:
            done = subprocess.run(
                [_postgres_bin("initdb"), "-D", str(data), "-U", POSTGRES_USER,
                 f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"],
                cwd=d, capture_output=True, text=True, check=False, **as_user(user))
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode:
            raise DeployError(f"initdb failed in {data}:\n{done.stdout}{done.stderr}")
    procs.start("postgres", [
        _postgres_bin("postgres"), "-D", str(data), "-c", "listen_addresses=127.0.0.1",
        "-c", f"port={port}", "-c", f"unix_socket_directories={run}",
    ], env={"PATH": os.environ.get("PATH", ""), "LANG": "C"}, cwd=d, user=user)

    import psycopg2

    def connect(dbname: str):
        return psycopg2.connect(host="127.0.0.1", port=port, user=POSTGRES_USER,
                                password=password, dbname=dbname, connect_timeout=2)

    wait_until(lambda: connect("postgres").close() is None, "connections", procs, "postgres")
    conn = connect("postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (POSTGRES_DB,))
        if cur.fetchone() is None:
            cur.execute(f'CREATE DATABASE "{POSTGRES_DB}"')
    conn.close()
    return f"{POSTGRES_USER}:{password}@127.0.0.1:{port}/{POSTGRES_DB}"


# --- Redis ----------------------------------------------------------------------------------
def start_redis(procs: Processes, state: Path, port: int) -> None:
    """Start the Celery broker on loopback (no persistence: a queue, not a store)."""
    exe = "/usr/bin/redis-server"
    if not os.access(exe, os.X_OK):
        raise DeployError("redis-server is not installed: run ./dev setup (it installs Debian's "
                          "redis-server package)")
    d = state / "redis"
    d.mkdir(parents=True, exist_ok=True)
    procs.start("redis", [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(d),
                          "--save", "", "--appendonly", "no", "--daemonize", "no"],
                env={"PATH": os.environ.get("PATH", "")})

    def ping() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    wait_until(ping, "PONG", procs, "redis")


# --- S3 (moto's server mode in place of MinIO) ----------------------------------------------
def start_s3(procs: Processes, port: int, bucket: str, login: str, password: str) -> str:
    """Start the S3 endpoint and create ``bucket`` (what minio-init does); return its URL."""
    url = f"http://127.0.0.1:{port}"
    moto = Path(sys.executable).parent / "moto_server"
    procs.start("s3", [str(moto), "-H", "127.0.0.1", "-p", str(port)],
                env={"PATH": os.environ.get("PATH", "")})
    wait_until(lambda: urllib.request.urlopen(url + "/moto-api/data.json", timeout=1)
               .status == 200, "answer", procs, "s3")
    import boto3

    client = boto3.client("s3", endpoint_url=url, region_name=REGION,
                          aws_access_key_id=login, aws_secret_access_key=password)
    if bucket not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=bucket)
    return url


def s3_connection(url: str, login: str, password: str) -> str:
    """Return ``AIRFLOW_CONN_AWS_DEFAULT`` for the endpoint (as .env.example's MinIO form)."""
    return json.dumps({"conn_type": "aws", "login": login, "password": password,
                       "extra": {"endpoint_url": url, "region_name": REGION}})


# --- the GPU host: sshd on loopback ----------------------------------------------------------
def _keygen(path: Path) -> str:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "regen-deploy",
                        "-f", str(path)], check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def start_sshd(procs: Processes, state: Path, port: int) -> str:
    """Start the GPU host's sshd for the current user; return ``AIRFLOW_CONN_GPU_HOST_SSH``."""
    exe = "/usr/sbin/sshd"
    if not os.access(exe, os.X_OK):
        raise DeployError("sshd is not installed: run ./dev setup (it installs openssh-server)")
    d = state / "gpu-host" / "ssh"
    d.mkdir(parents=True, exist_ok=True)
    host_pub = _keygen(d / "host_ed25519")
    user_pub = _keygen(d / "user_ed25519")
    (d / "authorized_keys").write_text(user_pub + "\n")
    os.chmod(d / "authorized_keys", 0o600)
    user = pwd.getpwuid(os.geteuid()).pw_name
    config = d / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_ed25519'}",
        f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
        "StrictModes no", "UsePAM no", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        f"AllowUsers {user}", "MaxStartups 50:30:100", "MaxSessions 50", "",
    ]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    procs.start("gpu-host-sshd", [exe, "-D", "-e", "-f", str(config)],
                env={"PATH": os.environ.get("PATH", "")})

    def banner() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")

    wait_until(banner, "SSH banner", procs, "gpu-host-sshd")
    host_key = " ".join(host_pub.split()[:2])  # type prefix included, as the hook needs
    return json.dumps({"conn_type": "ssh", "host": "127.0.0.1", "port": port, "login": user,
                       "extra": {"key_file": str(d / "user_ed25519"), "host_key": host_key,
                                 "no_host_key_check": False, "conn_timeout": 15}})


def stop_standins(server_log_dir: Path) -> list[int]:
    """SIGTERM stand-in servers a run left behind (pid files in ``server_log_dir``)."""
    stopped = []
    for pid_file in server_log_dir.glob("server-*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        if pid > 1 and b"sglang_standin" in cmdline:
            try:
                os.killpg(pid, signal.SIGTERM)
                stopped.append(pid)
            except ProcessLookupError:
                pass
    return stopped
