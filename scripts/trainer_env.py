"""The trainer venv: the released SpecForge and speculators, importable with CPU torch.

``./dev trainers`` builds it (once per machine; reused while ``requirements-trainers.txt`` is
unchanged) and runs ``tests/trainers/`` with it. The packages' declared requirements (sglang,
CUDA torch, flash-attn...) are neither installable here nor needed to load data, so the venv
holds exactly the pins of ``requirements-trainers.txt``, installed with ``--no-deps`` (that
file says how they were chosen); torch is the CPU wheel from a local folder, since PyPI's
Linux torch does not import without its CUDA libraries.

    python -m scripts.trainer_env            build it if needed; print its python
    python -m scripts.trainer_env --check    only say whether it is ready (exit 1 if not)
    python -m scripts.trainer_env --force --find-links DIR
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-trainers"
REQUIREMENTS = ROOT / "requirements-trainers.txt"
PYTHON_VERSION = "3.11"
#: Where a CPU torch wheel is looked for when ``--find-links`` is not given: pip's own
#: variable, then the folder where this project's machines keep PyTorch's CPU build.
DEFAULT_WHEEL_DIRS = ("/opt/wheels",)
#: What the tier imports: the loaders and the modules the trainers call them from.
IMPORT_CHECK = (
    "specforge.data.prompt_builder", "specforge.config.schema", "specforge.training.assembly",
    "specforge.algorithms.builtin", "speculators.data_generation.preprocessing",
    "speculators.cli", "speculators.train.config", "speculators.train.data",
)


class TrainerEnvError(RuntimeError):
    """The trainer venv cannot be built here; the message says why and what to do."""


def python() -> Path:
    """Return the trainer venv's interpreter (it may not exist yet)."""
    return VENV / "bin" / "python"


def pins_key(requirements: Path, python_version: str = PYTHON_VERSION) -> str:
    """Return what a pinned venv was built from: the pins' hash and the Python version."""
    return f"{hashlib.sha256(requirements.read_bytes()).hexdigest()} python{python_version}\n"


def venv_not_ready(venv: Path, requirements: Path) -> str | None:
    """Return why ``venv`` cannot be used as built from ``requirements``, or None if ready."""
    if not (venv / "bin" / "python").exists():
        return f"{venv} does not exist"
    marker = venv / ".installed"
    if not marker.exists() or marker.read_text() != pins_key(requirements):
        return f"{venv} was built from other pins than {requirements.name}"
    return None


def _key() -> str:
    return pins_key(REQUIREMENTS)


def not_ready() -> str | None:
    """Return why the venv cannot be used as it is, or None if it is ready."""
    return venv_not_ready(VENV, REQUIREMENTS)


def _torch_pin() -> str:
    match = re.search(r"^torch==(\S+)$", REQUIREMENTS.read_text(), re.MULTILINE)
    if not match:
        raise TrainerEnvError(f"{REQUIREMENTS}: no torch==<version> line")
    return match.group(1)


def find_torch_wheels(find_links: str | None = None) -> Path:
    """Return the folder holding the pinned CPU torch wheel for Python 3.11."""
    version = _torch_pin()
    candidates = [find_links] if find_links else [
        *os.environ.get("PIP_FIND_LINKS", "").split(), *DEFAULT_WHEEL_DIRS]
    pattern = f"torch-{version}-cp{PYTHON_VERSION.replace('.', '')}-*.whl"
    for folder in candidates:
        if folder and any(Path(folder).glob(pattern)):
            return Path(folder)
    raise TrainerEnvError(
        f"no wheel {pattern} in {', '.join(c for c in candidates if c) or 'no folder'}: the "
        f"trainer venv takes torch {version} (the CPU build; PyPI's Linux torch needs CUDA "
        "libraries to import). Put that wheel in a folder and run "
        "`python -m scripts.trainer_env --find-links DIR`")


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise TrainerEnvError(f"{what} failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")


def check_imports() -> None:
    """Import every module the tier uses in the venv; raise naming the first that fails."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([str(python()), "-c", code, *IMPORT_CHECK], capture_output=True,
                          text=True, env=env)
    if proc.returncode:
        raise TrainerEnvError(f"{VENV}: the trainers' modules do not import:\n"
                              f"{proc.stderr[-3000:]}")


def build(find_links: str | None = None, *, force: bool = False) -> Path:
    """Build the venv unless it is ready (or ``force``); return its interpreter.

    One build at a time (a lock beside the venv): a second caller waits, then finds it ready.
    """
    with open(ROOT / ".venv-trainers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and not_ready() is None:
            return python()
        uv = shutil.which("uv")
        if not uv:
            raise TrainerEnvError("uv is not on PATH: `python3 -m pip install uv` (./dev "
                                  "setup does it), then build again")
        wheels = find_torch_wheels(find_links)
        started = time.monotonic()
        print(f"==> building {VENV} from {REQUIREMENTS.name} (torch from {wheels})",
              file=sys.stderr, flush=True)
        shutil.rmtree(VENV, ignore_errors=True)
        _run([uv, "venv", "-q", "--python", PYTHON_VERSION, str(VENV)], "uv venv")
        _run([uv, "pip", "install", "-q", "--python", str(python()), "--no-deps",
              "--find-links", str(wheels), "-r", str(REQUIREMENTS)], "uv pip install")
        check_imports()
        (VENV / ".installed").write_text(_key())
        size = sum(p.stat().st_size for p in VENV.rglob("*") if p.is_file() and
                   not p.is_symlink())
        print(f"==> {VENV} built in {time.monotonic() - started:.0f} s, "
              f"{size / 2**20:,.0f} MiB", file=sys.stderr, flush=True)
        return python()


def main(argv: list[str] | None = None) -> int:
    """Build (or check) the trainer venv; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is ready")
    parser.add_argument("--force", action="store_true", help="build it again")
    parser.add_argument("--find-links", help="a folder holding the CPU torch wheel")
    args = parser.parse_args(argv)
    if args.check:
        reason = not_ready()
        print(reason or f"ready: {python()}")
        return 1 if reason else 0
    try:
        print(build(args.find_links, force=args.force))
    except TrainerEnvError as exc:
        print(f"trainer venv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
