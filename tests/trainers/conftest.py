"""The trainer tier's set-up: the trainer venv, one fresh demo run, its parquet and its card.

The run is a fresh ``./dev demo`` (``scripts.demo``: the whole DAG under ``airflow dags
test``, eight stand-in servers, outputs in a local S3 endpoint), in an Airflow home of its own
and on ports of its own, so the tier can run beside the others. ``TRAINERS_RUN=<run folder>``
uses a run already on disk instead (e.g. ``var/demo/<run_name>``; it is not written to).
The trainers run in ``.venv-trainers`` (scripts/trainer_env.py), never in the project's venv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts import trainer_env
from tests.fixtures.ports import free_port_block

ROOT = Path(__file__).resolve().parents[2]
#: How long the demo may take: ~2 min alone on two cores, ~5 min beside the other tiers.
DEMO_TIMEOUT_S = 1500
HOW_TO_BUILD = ("build it with `./dev trainers` (or `.venv/bin/python -m scripts.trainer_env`; "
                "it needs the CPU torch wheel: see requirements-trainers.txt)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "trainers: runs the released SpecForge and speculators loaders on a run "
        "(tests/trainers/, in .venv-trainers)")


@dataclass(frozen=True)
class Parquet:
    """The run's rows as the parquet holds them, shards in order."""

    ids: list[str]
    input_ids: list[list[int]]
    loss_mask: list[list[int]]

    def rows(self) -> list[list[list[int]]]:
        return [[i, m] for i, m in zip(self.input_ids, self.loss_mask, strict=True)]

    @property
    def longest(self) -> int:
        return max(map(len, self.input_ids))


@pytest.fixture(scope="session")
def trainer_python() -> Path:
    """Return the trainer venv's python, building the venv if needed; skip if it cannot be."""
    try:
        return trainer_env.build()
    except trainer_env.TrainerEnvError as exc:
        message = f"the trainer venv cannot be built here: {exc}\n{HOW_TO_BUILD}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must never pass by skipping the tier
        pytest.skip(message)


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder holding a fresh demo run's outputs (or ``TRAINERS_RUN``'s, linked)."""
    work = tmp_path_factory.mktemp("run")
    given = os.environ.get("TRAINERS_RUN")
    if given:
        source = Path(given).resolve()
        if not (source / "README.md").is_file():
            pytest.fail(f"TRAINERS_RUN={given}: no dataset card (README.md) there; give a "
                        "run's output folder, e.g. var/demo/<run_name>")
        for entry in source.iterdir():  # linked: the card's commands write beside them
            (work / entry.name).symlink_to(entry)
        return work
    name = f"trainers-{os.getpid()}-{int(time.time())}"
    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGEN_")}
    env.update(AIRFLOW_HOME=str(home), PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.demo", "--run-name", name,
         "--port-base", str(free_port_block(8))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    mirror = ROOT / "var" / "demo" / name
    if proc.returncode or not (mirror / "README.md").is_file():
        log = ROOT / "var" / "demo" / "dag-test.log"
        tail = log.read_text()[-4000:] if log.exists() else ""
        pytest.fail(f"the demo run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                    f"\n{proc.stderr[-2000:]}\n{tail}")
    target = work / name
    shutil.move(str(mirror), target)  # nothing of the tier's run stays in var/demo
    return target


@pytest.fixture(scope="session")
def parquet(run_dir: Path) -> Parquet:
    """Return the run's tokenized rows, read with pyarrow from every shard in order."""
    import pyarrow.parquet as pq

    ids: list[str] = []
    input_ids: list[list[int]] = []
    loss_mask: list[list[int]] = []
    shards = sorted((run_dir / "tokenized").glob("shard-*.parquet"))
    assert shards, f"{run_dir}: no tokenized/shard-*.parquet"
    for path in shards:
        table = pq.read_table(path, columns=["id", "input_ids", "loss_mask"])
        ids += table["id"].to_pylist()
        input_ids += table["input_ids"].to_pylist()
        loss_mask += table["loss_mask"].to_pylist()
    return Parquet(ids, input_ids, loss_mask)


@pytest.fixture(scope="session")
def card_blocks(run_dir: Path) -> dict[str, list[str]]:
    """Return the fenced code blocks of the card's "Training on this run" section, by
    language (``yaml``: SpecForge's ``data:`` block; ``bash``: speculators' commands)."""
    text = (run_dir / "README.md").read_text()
    match = re.search(r"^## Training on this run\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, f"{run_dir / 'README.md'}: no '## Training on this run' section"
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", match.group(1), re.M | re.S):
        blocks.setdefault(lang, []).append(body)
    return blocks


def trainer_env_vars(scratch: Path) -> dict[str, str]:
    """Return the environment of a trainer-venv process: offline, caches in ``scratch``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("REGEN_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(scratch / "hf"),
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               PATH=f"{trainer_env.python().parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return env
