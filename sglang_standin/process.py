"""Spawn stand-in servers as subprocesses for tests, benchmarks and the demo.

`start_standin(...)` is a context manager around `StandinProcess`: it runs
`python -m sglang_standin ...` with the log in a file, waits for /health 200 (unless
`wait=False`: it then returns at once, the port still closed) and always kills the process on
exit. `wait_for_log` and `wait_port_open` let a test watch the stages of a start
(`--standin-load-seconds`: alive with the port closed, then open and warming up, then healthy).
Keyword flags become command-line flags: `context_length=4096` becomes `--context-length 4096`,
`enable_metrics=True` becomes `--enable-metrics`, False/None are left out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the OS picks it; races are possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def flags_to_argv(flags: dict[str, Any]) -> list[str]:
    """Turn keyword flags into argv: underscores become dashes, True is a bare switch."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def standin_command(
    model_path: str | os.PathLike[str],
    port: int,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    **flags: Any,
) -> list[str]:
    """Return the argv that launches a stand-in with these flags."""
    base = [python, "-m", "sglang_standin", "--model-path", str(model_path)]
    return base + ["--host", host, "--port", str(port)] + flags_to_argv(flags)


class StandinProcess:
    """Own one `python -m sglang_standin` subprocess: start, wait for health, kill or stop.

    The log (stdout and stderr) goes to `log_path`, a temporary file unless given. Crash faults
    make the process exit by itself; `returncode` then tells how.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        **flags: Any,
    ) -> None:
        self.model_path = str(model_path)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.argv = standin_command(model_path, self.port, host, python, **flags)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"standin-{self.port}-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, wait: bool = True, timeout: float = 60.0) -> StandinProcess:
        """Launch the process; with `wait`, block until /health answers 200 (see wait_healthy)."""
        env = dict(os.environ if self._env is None else self._env)
        # The package lives at the repo root, which need not be on the child's sys.path.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        env.setdefault("HF_HUB_OFFLINE", "1")
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll /health until 200; raise RuntimeError (with the log tail) on exit or deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_alive():
                raise RuntimeError(
                    f"stand-in exited with {self.returncode} before becoming healthy:\n"
                    + self.log_tail()
                )
            try:
                # SGLang's /health takes at least 1 s when up; leave room for a loaded host.
                with urllib.request.urlopen(self.url + "/health", timeout=10.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while warming up
            time.sleep(0.05)
        raise RuntimeError(f"stand-in not healthy after {timeout:.0f} s:\n" + self.log_tail())

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Block until the log holds `text`; raise RuntimeError on exit or deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_path.read_text(errors="replace"):
                return
            if not self.is_alive():
                raise RuntimeError(
                    f"stand-in exited with {self.returncode} before logging {text!r}:\n"
                    + self.log_tail()
                )
            time.sleep(0.02)
        raise RuntimeError(f"stand-in did not log {text!r} in {timeout:.0f} s:\n" + self.log_tail())

    def port_open(self) -> bool:
        """Say whether the port accepts connections now."""
        try:
            with socket.create_connection((self.host, self.port), timeout=2.0):
                return True
        except OSError:
            return False

    def wait_port_open(self, timeout: float = 60.0) -> None:
        """Block until the port accepts connections; raise RuntimeError on exit or deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_open():
                return
            if not self.is_alive():
                raise RuntimeError(
                    f"stand-in exited with {self.returncode} before opening its port:\n"
                    + self.log_tail()
                )
            time.sleep(0.02)
        raise RuntimeError(f"stand-in port closed after {timeout:.0f} s:\n" + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        """Return the last `lines` lines of the log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the process (no cleanup, like a node dying) and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process, wait up to `timeout`, then SIGKILL."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> StandinProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def start_standin(
    port: int | None = None,
    model_path: str | os.PathLike[str] | None = None,
    *,
    timeout: float = 60.0,
    wait: bool = True,
    **flags: Any,
) -> Iterator[StandinProcess]:
    """Start a stand-in, wait until healthy (unless `wait=False`), yield it, stop it on exit.

    With `wait=False` it yields as soon as the process is spawned: the port may still be
    closed (see `StandinProcess.wait_port_open`).

    `model_path` is a tokenizer directory (see `sglang_standin.tokenizer.build_chat_tokenizer`);
    `port` None picks a free one. Other keywords are flags (see module docstring), including
    `host`, `log_path`, `python` and `env`, which StandinProcess takes itself.
    """
    if model_path is None:
        raise TypeError("start_standin() needs model_path (a local tokenizer directory)")
    proc = StandinProcess(model_path, port, **flags)
    try:
        proc.start(wait=wait, timeout=timeout)
        yield proc
    finally:
        proc.stop()


def shell_launch_command(python: str = sys.executable, module: str = "sglang_standin") -> str:
    """Return the launch command for a settings' ``server_launch_command`` (one shell line);
    ``module="sglang_standin.switchboard"`` for servers whose faults a file switches.

    The launcher runs it through a shell, possibly over SSH, where this repo is not on the
    path: the environment it needs is spelled out in the command itself.
    """
    return (f"env PYTHONPATH={_PACKAGE_PARENT} HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "
            f"{python} -m {module}")
