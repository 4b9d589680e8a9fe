"""Command builders: exact arguments, harmless hostile settings, the key file, start and stop.

Hostile values are not only inspected: the built commands are executed with ``sh`` and the
test checks that no planted file appeared and that the program got the values verbatim.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from include.servers.commands import (
    ServerPaths,
    ServerSpec,
    apply_prefix,
    build_launch_command,
    build_log_tail_command,
    default_bind_host,
    parse_fields,
    redact,
    server_config_yaml,
    server_specs,
)
from include.servers.lifecycle import (
    _lock,
    build_acquire_command,
    build_detached_command,
    build_release_command,
    build_status_command,
    build_stop_command,
)
from include.settings import RunSettings
from tests.fixtures.settings import run_settings

# Prints its argv as JSON: stands in for the server to see exactly what it would receive.
ECHO_ARGV = f"{sys.executable} -c 'import json,os,sys; print(json.dumps([os.environ.get(\"CUDA_VISIBLE_DEVICES\")] + sys.argv[1:]))'"  # noqa: E501


def settings(run: dict[str, object] | None = None, **deployment: object) -> RunSettings:
    deployment.setdefault("gpu_hosts", [{"host": "127.0.0.1", "gpus": [0]}])
    return run_settings(run, **deployment)


def sh(
    command: str, timeout: float = 30, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=timeout, check=False,
        input=stdin,
    )  # fmt: skip


def test_specs_expand_every_host_and_gpu_in_order() -> None:
    s = settings(
        port_base=31000,
        server_log_dir="/var/log/x",
        gpu_hosts=[
            {"host": "gpu-a", "ssh_conn_id": "ssh_a", "gpus": [0, 1]},
            {"host": "gpu-b", "ssh_conn_id": "ssh_b", "gpus": [2, 5, 7],
             "command_prefix": "pct exec 200 --"},
            {"host": "127.0.0.1", "gpus": [3]},
        ],
    )  # fmt: skip
    specs = server_specs(s)
    assert [(x.host, x.gpu, x.port) for x in specs] == [
        ("gpu-a", 0, 31000),
        ("gpu-a", 1, 31001),
        ("gpu-b", 2, 31002),
        ("gpu-b", 5, 31005),
        ("gpu-b", 7, 31007),
        ("127.0.0.1", 3, 31003),
    ]
    assert specs[0].url == "http://gpu-a:31000"
    assert specs[2].ssh_conn_id == "ssh_b" and specs[2].command_prefix == "pct exec 200 --"
    assert specs[5].ssh_conn_id is None
    assert specs[3].paths.pid_file == "/var/log/x/server-31005.pid"
    assert specs[3].paths.log_file == "/var/log/x/server-31005.log"
    assert ServerSpec.from_dict(json.loads(json.dumps(specs[3].to_dict()))) == specs[3]


def test_tensor_parallel_servers_take_consecutive_gpus() -> None:
    s = settings({"tp_size": 2}, gpu_hosts=[{"host": "h", "gpus": [0, 1, 2, 3]}])
    specs = server_specs(s)
    assert [(x.port, x.cuda_devices) for x in specs] == [(30000, (0, 1)), (30002, (2, 3))]
    assert "CUDA_VISIBLE_DEVICES=0,1 " in build_launch_command(specs[0], s)


@pytest.mark.parametrize(
    ("hosts", "tp", "fragment"),
    [
        ([{"host": "h", "gpus": [0, 1, 2]}], 2, "do not divide into servers of tp_size=2"),
        ([{"host": "h", "gpus": [0]}, {"host": "h", "gpus": [0]}], 1, "port 30000"),
        ([{"host": "h", "gpus": []}], 1, "`gpus` is empty"),
    ],
)
def test_bad_gpu_layouts_name_the_host_and_setting(hosts: list, tp: int, fragment: str) -> None:
    with pytest.raises(ValueError, match="setting `gpu_hosts` \\(h\\)") as err:
        server_specs(settings({"tp_size": tp}, gpu_hosts=hosts))
    assert fragment in str(err.value)


def test_bind_host_is_loopback_only_for_loopback_hosts() -> None:
    assert default_bind_host("127.0.0.1") == "127.0.0.1"
    assert default_bind_host("localhost") == "localhost"
    assert default_bind_host("::1") == "::1"
    assert default_bind_host("gpu-node-3") == "0.0.0.0"
    assert default_bind_host("10.0.0.7") == "0.0.0.0"


def test_launch_command_passes_every_setting_as_one_argument() -> None:
    s = settings(
        {"model_path": "/models/Qwen 3.6", "served_model_name": "qwen",
         "context_length": 16384, "tp_size": 1, "mem_fraction_static": 0.8,
         "reasoning_parser": "qwen3", "tokenizer_path": "Qwen/Tok"},
        api_key="s3cret key",
        allowed_tokenizers=["Qwen/Tok"],
        extra_server_args=["--enable-metrics", "--max-running-requests", "64"],
        server_launch_command="python3 -m sglang.launch_server",
        gpu_hosts=[{"host": "gpu-a", "gpus": [4]}],
    )
    spec = server_specs(s)[0]
    command = build_launch_command(spec, s, config_file=spec.paths.config_file)
    words = shlex.split(command)
    assert words[:5] == ["env", "CUDA_VISIBLE_DEVICES=4", "python3", "-m", "sglang.launch_server"]
    args = words[5:]
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--model-path"] == "/models/Qwen 3.6"
    assert pairs["--served-model-name"] == "qwen"
    assert pairs["--host"] == "0.0.0.0"
    assert pairs["--port"] == "30004"
    assert pairs["--context-length"] == "16384"
    assert pairs["--mem-fraction-static"] == "0.8"
    assert pairs["--reasoning-parser"] == "qwen3"
    assert pairs["--tokenizer-path"] == "Qwen/Tok"
    assert pairs["--config"] == "/tmp/sglang-regen/server-30004.config.yaml"
    assert args[-3:] == ["--enable-metrics", "--max-running-requests", "64"]
    # The key is in no command: not the launch, not the detached start, not status or stop.
    paths = spec.paths
    built = [
        command,
        build_launch_command(spec, s),
        build_detached_command(command, paths, owner="dag/run", config_bytes=40),
        build_status_command(paths),
        build_acquire_command(paths, "dag/run"),
        build_release_command(paths, "dag/run"),
        build_stop_command(paths),
    ]
    assert s.api_key == "s3cret key"
    assert not [c for c in built if "s3cret" in c or "--api-key" in c]
    assert "--config" not in build_launch_command(spec, s)


@pytest.mark.parametrize(
    "key", ["plain-key", "yes", "0x10", "1e3", "null", "a: b", "it's \"quoted\"", "#x", "ключ"]
)
def test_config_file_gives_the_key_back_verbatim_as_text(key: str) -> None:
    # SGLang reads the file with yaml.safe_load and passes str(value) as --api-key.
    assert yaml.safe_load(server_config_yaml(key)) == {"api-key": key}


def test_hostile_settings_reach_the_program_verbatim_and_run_nothing(tmp_path: Path) -> None:
    # Run settings with shell syntax are refused by their patterns; the deployment's words
    # (launch command, container prefix, log dir, extra args) and the model path are quoted.
    marks = [tmp_path / f"pwned{i}" for i in range(6)]
    log_dir = str(tmp_path / f"logs $(touch {marks[1]}) `touch {marks[2]}`")
    hostile = {
        "model_path": f"x; touch {marks[0]}",
        "extra_server_args": [f'--x=" && touch {marks[4]}', "\n", f"|| touch {marks[5]}"],
    }
    s = settings(
        {"model_path": hostile["model_path"]},
        server_launch_command=ECHO_ARGV + f" 'a b' \"$(touch {marks[3]})\"",
        server_log_dir=log_dir,
        extra_server_args=hostile["extra_server_args"],
    )
    spec = server_specs(s)[0]
    command = build_launch_command(spec, s, config_file=spec.paths.config_file)
    prefix = f"env X=1 sh -c 'exec \"$@\"' \"$(touch {marks[3]})\""  # $0 is that text
    done = sh(apply_prefix(command, prefix))
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "0"  # CUDA_VISIBLE_DEVICES
    assert argv[1:3] == ["a b", f"$(touch {marks[3]})"]  # launch-command words, verbatim
    assert argv[argv.index("--model-path") + 1] == hostile["model_path"]
    assert argv[argv.index("--config") + 1] == f"{log_dir}/server-30000.config.yaml"
    assert argv[-3:] == hostile["extra_server_args"]
    assert not [m for m in marks if m.exists()]


def test_hostile_launch_command_and_prefix_cannot_add_shell_syntax(tmp_path: Path) -> None:
    mark = tmp_path / "pwned"
    s = settings(server_launch_command=f"true; touch {mark}")
    done = sh(build_launch_command(server_specs(s)[0], s))
    assert done.returncode != 0  # "true;" is one word: a program that does not exist
    prefixed = apply_prefix("echo inside", f"nice -n 0 $(touch {mark})")
    sh(prefixed)
    assert not mark.exists()


def test_prefix_wraps_the_whole_command_in_one_sh_argument(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = f"echo one > {shlex.quote(str(out))}; echo two >> {shlex.quote(str(out))}"
    prefixed = apply_prefix(command, "env FOO=bar")
    assert prefixed.startswith("env FOO=bar sh -c ")
    assert sh(prefixed).returncode == 0
    assert out.read_text() == "one\ntwo\n"
    assert apply_prefix("x", None) == "x" and apply_prefix("x", "  ") == "x"


def _fake_server(port: int, seconds: int = 60) -> str:
    # A long sleeper whose command line carries "--port P" like a real server's.
    return f"{shlex.quote(sys.executable)} -c 'import time; time.sleep({seconds})' --port {port}"


@pytest.fixture
def odd_dir(tmp_path: Path) -> Path:
    # Spaces, quotes and a command substitution in the directory name must all stay inert.
    d = tmp_path / "logs with 'quotes' $(touch pwned)"
    return d


def test_detached_start_status_and_stop(odd_dir: Path, tmp_path: Path) -> None:
    paths = ServerPaths(str(odd_dir), 41999)
    first = sh(build_detached_command(_fake_server(41999), paths, owner="dag/run 1"))
    assert first.returncode == 0, first.stderr
    pid = int(parse_fields(first.stdout)["pid"])
    try:
        assert os.getpgid(pid) == pid  # its own process group, so stop can signal the group
        status = parse_fields(sh(build_status_command(paths)).stdout)
        assert status == {"pid": str(pid), "alive": "1", "leases": "1", "owner": "dag/run 1"}
        assert "starting on" in Path(paths.log_file).read_text()
        started = time.monotonic()
        stopped = sh(build_stop_command(paths, grace_s=5))
        assert stopped.stdout.strip() == f"stopped pid={pid}", stopped.stderr
        assert time.monotonic() - started < 5  # SIGTERM suffices; no need to wait the grace
        assert not Path(paths.pid_file).exists()
        assert parse_fields(sh(build_status_command(paths)).stdout)["alive"] == "0"
        again = sh(build_stop_command(paths, grace_s=1))
        assert again.stdout.strip() == "not-running pid="
        # A second launch keeps the first log as .log.prev.
        second = sh(build_detached_command(_fake_server(41999), paths))
        pid2 = int(parse_fields(second.stdout)["pid"])
        assert Path(paths.previous_log_file).exists()
        assert sh(build_stop_command(paths, grace_s=5)).stdout.strip() == f"stopped pid={pid2}"
    finally:
        for p in (pid, locals().get("pid2")):
            if p:
                try:
                    os.killpg(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def _kill_group(pid: int | None) -> None:
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_key_file_comes_from_stdin_private_and_goes_at_stop(odd_dir: Path, tmp_path: Path) -> None:
    paths = ServerPaths(str(odd_dir), 42003)
    content = server_config_yaml("sk-from-stdin")
    # The "server" prints its config file, as SGLang reads it at start.
    server = f"cat {shlex.quote(paths.config_file)}; " + _fake_server(42003)
    command = build_detached_command(
        f"sh -c {shlex.quote(server)}", paths, config_bytes=len(content.encode())
    )
    assert "sk-from-stdin" not in command
    done = sh(command, stdin=content)
    pid = int(parse_fields(done.stdout)["pid"])
    try:
        assert os.stat(paths.config_file).st_mode & 0o777 == 0o600
        assert yaml.safe_load(Path(paths.config_file).read_text()) == {"api-key": "sk-from-stdin"}
        for private in (paths.log_file, paths.pid_file, paths.owner_file):
            assert os.stat(private).st_mode & 0o077 == 0, private  # SGLang logs the key
        deadline = time.monotonic() + 10  # the "server" prints its config as it starts
        while "sk-from-stdin" not in Path(paths.log_file).read_text():
            assert time.monotonic() < deadline, Path(paths.log_file).read_text()
            time.sleep(0.05)
        assert sh(build_stop_command(paths, grace_s=5)).stdout.strip() == f"stopped pid={pid}"
        assert not Path(paths.config_file).exists()
    finally:
        _kill_group(pid)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_a_short_key_file_never_starts_a_server(odd_dir: Path, tmp_path: Path) -> None:
    # A container prefix that drops stdin (docker exec without -i) must not start a keyless
    # server: the command fails, says why, and leaves no config and no process.
    paths = ServerPaths(str(odd_dir), 42004)
    content = server_config_yaml("sk-lost")
    done = sh(build_detached_command(_fake_server(42004), paths, config_bytes=len(content)),
              stdin="")  # fmt: skip
    assert done.returncode == 6
    assert "got 0 of" in done.stderr and "docker exec -i" in done.stderr
    assert not Path(paths.config_file).exists() and not Path(paths.pid_file).exists()
    assert not Path(paths.lock_dir).exists()
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_leases_keep_a_server_until_the_last_run_releases_it(tmp_path: Path) -> None:
    paths = ServerPaths(str(tmp_path), 42005)
    first = parse_fields(sh(build_detached_command(_fake_server(42005), paths,
                                                   owner="dag/run 1")).stdout)  # fmt: skip
    pid = int(first["pid"])
    try:
        second = parse_fields(sh(build_acquire_command(paths, "dag/run: 2")).stdout)
        assert second == {"pid": str(pid), "alive": "1", "leases": "2", "owner": "dag/run 1"}
        again = parse_fields(sh(build_acquire_command(paths, "dag/run: 2")).stdout)
        assert again["leases"] == "2"  # a retried launch adds no second lease
        kept = parse_fields(sh(build_release_command(paths, "dag/run 1", grace_s=5)).stdout)
        assert kept == {"outcome": "kept", "leases": "1", "holders": "dag/run: 2"}
        assert os.getpgid(pid) == pid  # still running
        assert sh(build_release_command(paths, "dag/run 1", grace_s=5)).stdout.startswith("kept")
        last = sh(build_release_command(paths, "dag/run: 2", grace_s=5)).stdout.strip()
        assert last == f"stopped pid={pid}"
        assert not Path(paths.lease_dir).exists() and not Path(paths.lock_dir).exists()
    finally:
        _kill_group(pid)


def test_a_lock_whose_holder_died_is_free_and_two_waiters_never_share_it(
    tmp_path: Path,
) -> None:
    paths = ServerPaths(str(tmp_path), 42006)
    # A holder killed mid-command: the kernel drops its flock, the next command goes on.
    holder = subprocess.Popen(["sh", "-c", _lock(paths) + "\nsleep 30"],
                              start_new_session=True)
    time.sleep(0.5)
    os.killpg(holder.pid, signal.SIGKILL)  # the shell and its sleep: every fd 9 holder
    holder.wait()
    assert sh(build_release_command(paths, "x", grace_s=1)).stdout.strip() == "not-running pid="
    # Two waiters behind one holder take the lock one after the other, never together.
    spans = tmp_path / "spans"
    body = f"{_lock(paths)}\necho start $(date +%s.%N) >> {spans}\nsleep 0.4\n" \
           f"echo end $(date +%s.%N) >> {spans}"
    procs = [subprocess.Popen(["sh", "-c", body]) for _ in range(3)]
    assert [p.wait(20) for p in procs] == [0, 0, 0]
    events = [line.split() for line in spans.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["start", "end"] * 3  # no overlap


@pytest.mark.parametrize("kind", ["link", "world_writable"])
def test_a_log_directory_others_can_write_or_redirect_is_refused(
    tmp_path: Path, kind: str
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    log_dir = tmp_path / "logs"
    if kind == "link":
        log_dir.symlink_to(real)
    else:
        log_dir.mkdir()
        log_dir.chmod(0o777)
    paths = ServerPaths(str(log_dir), 42008)
    done = sh(build_detached_command(_fake_server(42008), paths, owner="r"))
    assert done.returncode == 4 and "REGEN_SERVER_LOG_DIR" in done.stderr
    assert not list(real.iterdir()) and not Path(paths.pid_file).exists()


def test_stop_ignores_a_pid_file_naming_another_process(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        paths = ServerPaths(str(tmp_path), 42001)
        for content in (str(bystander.pid), "1", "0", "-1", "garbage; rm -rf /"):
            Path(paths.pid_file).write_text(content)
            out = sh(build_stop_command(paths, grace_s=1)).stdout.strip()
            assert out.startswith("not-running"), (content, out)
            assert bystander.poll() is None
        Path(paths.pid_file).write_text(str(bystander.pid))
        assert parse_fields(sh(build_status_command(paths)).stdout)["alive"] == "0"
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    paths = ServerPaths(str(tmp_path), 42002)
    stubborn = (
        f"{shlex.quote(sys.executable)} -c 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)' --port 42002"
    )
    pid = int(parse_fields(sh(build_detached_command(stubborn, paths)).stdout)["pid"])
    time.sleep(0.5)  # let it install the handler
    out = sh(build_stop_command(paths, grace_s=0.4)).stdout.strip()
    assert out == f"stopped pid={pid}"


def test_log_tail_of_a_missing_file_is_empty_and_succeeds(tmp_path: Path) -> None:
    done = sh(build_log_tail_command(str(tmp_path / "nope.log"), 5))
    assert done.returncode == 0 and done.stdout == ""
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert sh(build_log_tail_command(str(log), 2)).stdout == "line 8\nline 9\n"


def test_parse_fields_keeps_spaces_in_owner() -> None:
    assert parse_fields("noise\npid=12 alive=1 owner=dag/run id with spaces\n") == {
        "pid": "12",
        "alive": "1",
        "owner": "dag/run id with spaces",
    }
    assert parse_fields("stopped pid=5") == {"outcome": "stopped", "pid": "5"}
    assert parse_fields("kept leases=2 holders=a/b c, d=e") == {
        "outcome": "kept", "leases": "2", "holders": "a/b c, d=e"
    }  # fmt: skip
    assert parse_fields("") == {}


def test_redact_replaces_every_occurrence_and_nothing_without_a_secret() -> None:
    text = "server_args=ServerArgs(api_key='k-123', port=1) k-123"
    assert redact(text, "k-123") == "server_args=ServerArgs(api_key='***', port=1) ***"
    assert redact(text, None) == text
