"""Two launches of one server that both saw it down: the second leases, never starts another.

A run decides to start a server from a status read without the lock; another run's launch can
take the lock first. The detached command re-checks under the lock (``lifecycle.py``).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from include.servers.commands import ServerPaths, parse_fields
from include.servers.lifecycle import (
    build_detached_command,
    build_release_command,
    build_status_command,
)


def _sh(command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                          check=False, input=stdin)


def _fake_server(port: int) -> str:
    return f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)' --port {port}"


def _servers_on(port: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if f"--port {port} " in cmdline + " " and "time.sleep(60)" in cmdline:
            pids.append(int(proc.name))
    return sorted(pids)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_a_launch_that_finds_a_live_server_under_the_lock_leases_it(tmp_path: Path) -> None:
    paths = ServerPaths(str(tmp_path), 42031)
    first = parse_fields(_sh(build_detached_command(
        _fake_server(42031), paths, owner="dag/run A", config_bytes=6), stdin="key-A\n").stdout)
    try:
        assert first["pid"].isdigit() and "already" not in first
        config_before = Path(paths.config_file).read_text()
        second = _sh(build_detached_command(_fake_server(42031), paths, owner="dag/run B",
                                            config_bytes=6), stdin="key-B\n")
        assert second.returncode == 0, second.stderr
        assert parse_fields(second.stdout) == {"pid": first["pid"], "already": "1"}
        assert _servers_on(42031) == [int(first["pid"])]  # no second process
        # The running server's config (its key) is untouched; both runs hold a lease.
        assert Path(paths.config_file).read_text() == config_before == "key-A\n"
        status = parse_fields(_sh(build_status_command(paths)).stdout)
        assert status["leases"] == "2" and status["owner"] == "dag/run A"
        # The first run's teardown keeps it for the second.
        kept = parse_fields(_sh(build_release_command(paths, "dag/run A", grace_s=5)).stdout)
        assert kept["outcome"] == "kept" and kept["holders"] == "dag/run B"
    finally:
        _kill(_servers_on(42031))


def test_two_launches_at_once_start_one_process(tmp_path: Path) -> None:
    paths = ServerPaths(str(tmp_path), 42032)
    commands = [build_detached_command(_fake_server(42032), paths, owner=f"dag/run {n}")
                for n in "AB"]
    try:
        procs = [subprocess.Popen(["sh", "-c", c], stdout=subprocess.PIPE, text=True)
                 for c in commands]
        outs = [parse_fields(p.communicate(timeout=60)[0]) for p in procs]
        assert len({o["pid"] for o in outs}) == 1, outs  # both name the same server
        assert sorted(o.get("already", "0") for o in outs) == ["0", "1"]
        assert _servers_on(42032) == [int(outs[0]["pid"])]
        assert parse_fields(_sh(build_status_command(paths)).stdout)["leases"] == "2"
    finally:
        _kill(_servers_on(42032))


def test_status_refuses_to_read_a_log_directory_others_could_plant_in(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "server-42033.pid").write_text(f"{os.getpid()}\n")
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    for log_dir in (linked, shared):
        done = _sh(build_status_command(ServerPaths(str(log_dir), 42033)))
        assert done.returncode == 4 and "REGEN_SERVER_LOG_DIR" in done.stderr, done
        assert "pid=" not in done.stdout
    # Before the first launch the directory does not exist: nothing to report, no error.
    fresh = _sh(build_status_command(ServerPaths(str(tmp_path / "fresh"), 42033)))
    assert fresh.returncode == 0 and parse_fields(fresh.stdout)["alive"] == "0"


def test_the_launcher_reports_a_server_found_under_the_lock_as_leased_not_started() -> None:
    from include.servers.commands import server_specs
    from include.servers.decisions import run_holds, started_outcome
    from tests.fixtures.settings import run_settings

    spec = server_specs(run_settings(gpu_hosts=[{"host": "127.0.0.1", "gpus": [0]}]))[0]
    found = started_outcome(spec, "started", "dag/run B", "4242", already=True)
    assert found.action == "loading" and not found.started_by_this_run and found.leased
    assert "another run's launch" in found.detail and run_holds(found)
    started = started_outcome(spec, "started", "dag/run B", "4242")
    assert started.action == "started" and started.started_by_this_run


def test_a_local_tokenizer_path_stays_on_the_worker_and_the_servers_use_the_models_own(
    tmp_path: Path,
) -> None:
    from include.servers.commands import build_launch_command, server_specs
    from tests.fixtures.settings import run_settings

    local = tmp_path / "tok"
    local.mkdir()
    deployment = {"gpu_hosts": [{"host": "gpu-a", "gpus": [0]}], "data_roots": [str(tmp_path)],
                  "allowed_tokenizers": ["Qwen/Tok"]}
    for value, sent in ((str(local), None), ("Qwen/Tok", "Qwen/Tok"), (None, None)):
        s = run_settings({"tokenizer_path": value}, **deployment)
        words = shlex.split(build_launch_command(server_specs(s)[0], s))
        got = words[words.index("--tokenizer-path") + 1] if "--tokenizer-path" in words else None
        assert got == sent, value
