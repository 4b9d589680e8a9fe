"""The real SGLang 0.5.23 on this machine's CPU: its environment, its model, its launch words.

``.venv-sglang`` holds exactly ``requirements-sglang.txt`` (the environment that served here,
../shared/docs/real-sglang-cpu.md); it is built once per machine and again only when the pins
change, as ``.venv-trainers`` is. The served model is ``scripts/tiny_qwen3.py``'s, built once
per seed into ``var/real-sglang/``. A CPU host runs the released server as a deployment would
set it, through the project's own launcher: ``server_launch_command`` and
``extra_server_args`` below are deployment settings (``REGEN_SERVER_LAUNCH_COMMAND``,
``REGEN_EXTRA_SERVER_ARGS``), and the only non-SGLang code in the server is
``deploy/cpu/sgl_kernel``, first on its ``PYTHONPATH``.

    python -m scripts.sglang_env            build what is missing; print the model directory
    python -m scripts.sglang_env --check    only say whether it is ready (exit 1 if not)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scripts.trainer_env import pins_key, venv_not_ready

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-sglang"
REQUIREMENTS = ROOT / "requirements-sglang.txt"
KERNEL_STANDIN = ROOT / "deploy" / "cpu"
MODELS = ROOT / "var" / "real-sglang"
PYTHON_VERSION = "3.11"
#: The served context: small, so a server's KV pool and a whole tier fit in memory and time.
CONTEXT_LENGTH = 512
#: How a deployment serves SGLang on a CPU host (the flags that served here, with
#: ../shared/docs/real-sglang-cpu.md's reasons): the CPU engine, torch-native attention, no
#: CUDA graphs, a KV pool of 32k tokens (without it ~14.5 GB of RAM), metrics for the pool,
#: Qwen3's tool-call parser (the reasoning parser is a run setting).
CPU_SERVER_ARGS = (
    "--device", "cpu", "--attention-backend", "torch_native",
    "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
    "--max-total-tokens", "32768", "--max-running-requests", "32",
    "--tool-call-parser", "qwen", "--enable-metrics",
)  # fmt: skip
#: SGLang's own request log, on: each server records every request's prompt ids and sampled
#: ids in its log (``--log-requests-level 3``: whole; JSON, one line a request), so what a run
#: trained on can be checked against what the server did, not against the client's copy.
REQUEST_LOG_ARGS = ("--log-requests", "--log-requests-level", "3",
                    "--log-requests-format", "json")


class SglangEnvError(RuntimeError):
    """The SGLang environment cannot be built here; the message says why and what to do."""


def python() -> Path:
    """Return the environment's interpreter (it may not exist yet)."""
    return VENV / "bin" / "python"


def _key() -> str:
    return pins_key(REQUIREMENTS)


def not_ready() -> str | None:
    """Return why the environment cannot be used as it is, or None if it is ready."""
    return venv_not_ready(VENV, REQUIREMENTS)


def launch_command() -> str:
    """Return the ``server_launch_command`` a CPU host of this machine gets."""
    return (f"env SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 "
            f"PYTHONPATH={shlex.quote(str(KERNEL_STANDIN))} "
            f"{shlex.quote(str(python()))} -m sglang.launch_server")


def model_dir(seed: int = 0) -> Path:
    """Return where the tiny model of ``seed`` is (or will be) built."""
    from scripts.tiny_qwen3 import BUILDER_VERSION

    # The builder's version in the name: a server still serving an older build is never
    # taken for one serving this build (the launcher reuses servers by path and name).
    return MODELS / f"tiny-qwen3-v{BUILDER_VERSION}-s{seed}-c{CONTEXT_LENGTH}"


def finished_requests(logs: list[Path]) -> list[dict]:
    """Return the ``request.finished`` records of SGLang's JSON request log in server logs.

    Less the server's own ``/health_generate`` probes (``rid`` ``HEALTH_CHECK_...``, one
    input id): they are no request of a run.
    """
    records = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            start = line.find('{"timestamp"')
            if start >= 0 and '"request.finished"' in line:
                record = json.loads(line[start:])
                if (record.get("event") == "request.finished"
                        and not str(record.get("rid", "")).startswith("HEALTH_CHECK")):
                    records.append(record)
    return records


def served_ids(records: list[dict]) -> dict[tuple[int, ...], list[list[int]]]:
    """Return prompt ids -> the ids sampled after them, from ``finished_requests``."""
    out: dict[tuple[int, ...], list[list[int]]] = {}
    for record in records:
        prompt, sampled = record["obj"].get("input_ids"), record["out"].get("output_ids")
        if isinstance(sampled, str):  # the log writes long lists as their text
            sampled = json.loads(sampled)
        if prompt:
            out.setdefault(tuple(prompt), []).append(list(sampled))
    return out


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SglangEnvError(f"{what} failed ({shlex.join(cmd)}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def _say(text: str) -> None:
    print(f"==> {text}", file=sys.stderr, flush=True)


def build_venv(*, force: bool = False) -> Path:
    """Build ``.venv-sglang`` unless it is ready; return its interpreter (one builder at a time)."""
    with open(ROOT / ".venv-sglang.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and not_ready() is None:
            return python()
        uv = shutil.which("uv")
        if not uv:
            raise SglangEnvError("uv is not on PATH: `python3 -m pip install uv` (./dev setup "
                                 "does it), then build again")
        free = shutil.disk_usage(ROOT).free / 2**30
        if free < 22:
            raise SglangEnvError(f"{free:.0f} GiB free at {ROOT}: the SGLang environment takes "
                                 "about 9.5 GiB plus 9.6 GiB of download cache; free some room")
        started = time.monotonic()
        _say(f"building {VENV} from {REQUIREMENTS.name}: SGLang 0.5.23 and its 207 pins, "
             "about 9.5 GiB (+9.6 GiB of uv cache), 3-4 min on a cold cache, once per machine")
        shutil.rmtree(VENV, ignore_errors=True)
        _run([uv, "venv", "-q", "--python", PYTHON_VERSION, str(VENV)], "uv venv")
        _run([uv, "pip", "install", "-q", "--python", str(python()), "-r", str(REQUIREMENTS)],
             "uv pip install")
        (VENV / ".installed").write_text(_key())
        _say(f"{VENV} built in {time.monotonic() - started:.0f} s")
        return python()


def build_model(seed: int = 0) -> Path:
    """Build the tiny Qwen3 model of ``seed`` unless it is there; return its directory."""
    out = model_dir(seed)
    with open(ROOT / ".venv-sglang.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run([str(python()), "-m", "scripts.tiny_qwen3", str(out), "--seed", str(seed),
              "--context-length", str(CONTEXT_LENGTH)], "building the tiny Qwen3 model")
    return out


def build(seed: int = 0) -> Path:
    """Build whatever is missing (environment, model); return the model directory."""
    build_venv()
    return build_model(seed)


def main(argv: list[str] | None = None) -> int:
    """Build (or check) the environment and model; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is ready")
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's seed")
    args = parser.parse_args(argv)
    if args.check:
        reason = not_ready()
        print(reason or f"ready: {python()}")
        return 1 if reason else 0
    try:
        print(build(args.seed))
    except SglangEnvError as exc:
        print(f"sglang env: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
