"""Command builders: exact arguments, harmless hostile settings, detached start and stop.

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

from include.servers.commands import (
    ServerPaths,
    ServerSpec,
    apply_prefix,
    build_detached_command,
    build_launch_command,
    build_log_tail_command,
    build_status_command,
    build_stop_command,
    default_bind_host,
    parse_fields,
    server_specs,
)
from include.settings import RunSettings
from tests.fixtures.settings import run_settings

# Prints its argv as JSON: stands in for the server to see exactly what it would receive.
ECHO_ARGV = f"{sys.executable} -c 'import json,os,sys; print(json.dumps([os.environ.get(\"CUDA_VISIBLE_DEVICES\")] + sys.argv[1:]))'"  # noqa: E501


def settings(**values: object) -> RunSettings:
    base: dict[str, object] = {"gpu_hosts": [{"host": "127.0.0.1", "gpus": [0]}]}
    return run_settings({**base, **values})


def sh(command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=timeout, check=False
    )


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
    s = settings(tp_size=2, gpu_hosts=[{"host": "h", "gpus": [0, 1, 2, 3]}])
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
        server_specs(settings(gpu_hosts=hosts, tp_size=tp))
    assert fragment in str(err.value)


def test_bind_host_is_loopback_only_for_loopback_hosts() -> None:
    assert default_bind_host("127.0.0.1") == "127.0.0.1"
    assert default_bind_host("localhost") == "localhost"
    assert default_bind_host("gpu-node-3") == "0.0.0.0"


def test_launch_command_passes_every_setting_as_one_argument() -> None:
    s = settings(
        model_path="/models/Qwen 3.6",
        served_model_name="qwen",
        context_length=16384,
        tp_size=1,
        mem_fraction_static=0.8,
        reasoning_parser="qwen3",
        api_key="s3cret key",
        tokenizer_path="/tok",
        extra_server_args=["--enable-metrics", "--max-running-requests", "64"],
        server_launch_command="python3 -m sglang.launch_server",
        gpu_hosts=[{"host": "gpu-a", "gpus": [4]}],
    )
    spec = server_specs(s)[0]
    words = shlex.split(build_launch_command(spec, s))
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
    assert pairs["--api-key"] == "s3cret key"
    assert pairs["--tokenizer-path"] == "/tok"
    assert args[-3:] == ["--enable-metrics", "--max-running-requests", "64"]
    redacted = build_launch_command(spec, s, redact_secrets=True)
    assert "s3cret" not in redacted and "--api-key '***'" in redacted


def test_hostile_settings_reach_the_program_verbatim_and_run_nothing(tmp_path: Path) -> None:
    marks = [tmp_path / f"pwned{i}" for i in range(6)]
    hostile = {
        "model_path": f"x; touch {marks[0]}",
        "served_model_name": f"$(touch {marks[1]})",
        "api_key": f"`touch {marks[2]}`",
        "reasoning_parser": f"qwen3' ; touch {marks[3]} ; '",
        "extra_server_args": [f'--x=" && touch {marks[4]}', "\n", f"|| touch {marks[5]}"],
    }
    s = settings(server_launch_command=ECHO_ARGV, **hostile)
    spec = server_specs(s)[0]
    done = sh(build_launch_command(spec, s))
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "0"  # CUDA_VISIBLE_DEVICES
    assert argv[argv.index("--model-path") + 1] == hostile["model_path"]
    assert argv[argv.index("--served-model-name") + 1] == hostile["served_model_name"]
    assert argv[argv.index("--api-key") + 1] == hostile["api_key"]
    assert argv[argv.index("--reasoning-parser") + 1] == hostile["reasoning_parser"]
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
        assert status == {"pid": str(pid), "alive": "1", "owner": "dag/run 1"}
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
    assert parse_fields("") == {}
