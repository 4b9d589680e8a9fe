"""The released SpecForge (0.2.0) and speculators (0.9.0) read a fresh run's exports, as the
run's dataset card tells a user to, and get every row exactly as the parquet holds it.

Each trainer's own code does the reading, in the trainer venv (tests/trainers/trainer_probe.py):
SpecForge's config loader and prompt preparation on a config holding the card's ``data:``
block as pasted; speculators' ``prepare-data`` command line from the card, run as it stands,
its pre-tokenized pass-through, and the datasets its ``train`` builds from that output. Beside
each, what goes wrong without the card's care: a shorter ``max_length`` cuts rows, the wrong
folder is not read, ``prepare-data`` shuffles and holds out rows.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainers.conftest import Parquet, trainer_env_vars

pytestmark = [pytest.mark.trainers, pytest.mark.integration, pytest.mark.timeout(2400)]
PROBE = Path(__file__).with_name("trainer_probe.py")
#: SpecForge's ``DataConfig.max_length`` default (specforge/config/schema.py).
SPECFORGE_DEFAULT_MAX_LENGTH = 2048
#: ``prepare-data --seed``'s default, which its shuffles use.
PREPARE_DATA_SEED = 0
#: The rest of a SpecForge config, which is the user's own (online training reads its features
#: from an external SGLang server); the card's ``data:`` block is pasted below it.
SPECFORGE_CONFIG = """model:
  target_model_path: {model}
deployment:
  mode: disaggregated
  disaggregated:
    control_dir: ./specforge-control
    backend: mooncake
training:
  strategy: {strategy}
"""


def _probe(python: Path, command: str, job: dict[str, Any], run_dir: Path,
           scratch: Path) -> dict[str, Any]:
    job_path, out_path = scratch / f"{command}-job.json", scratch / f"{command}-out.json"
    job_path.write_text(json.dumps(job))
    proc = subprocess.run([str(python), str(PROBE), command, str(job_path), str(out_path)],
                          cwd=run_dir, env=trainer_env_vars(scratch), capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, f"{command} probe failed:\n{proc.stderr[-5000:]}"
    return json.loads(out_path.read_text())


def _commands(block: str) -> list[list[str]]:
    """Return the shell commands of a card's bash block (continuation lines joined)."""
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()
            if line.strip()]


@pytest.fixture(scope="session")
def card(card_blocks: dict[str, list[str]]) -> dict[str, Any]:
    """Return the card's snippets: SpecForge's ``data:`` block, speculators' commands."""
    assert len(card_blocks.get("yaml", [])) == 1 and len(card_blocks.get("bash", [])) == 1, (
        f"the card's training section should hold one yaml and one bash block: {card_blocks}")
    commands = _commands(card_blocks["bash"][0])
    prepare = next(c for c in commands if c[:2] == ["speculators", "prepare-data"])
    train = next(c for c in commands if c[:2] == ["speculators", "train"])
    return {"data_block": card_blocks["yaml"][0], "prepare": prepare, "train": train,
            "model": prepare[prepare.index("--model") + 1]}


@pytest.fixture(scope="session")
def specforge_out(trainer_python: Path, run_dir: Path, card: dict[str, Any], parquet: Parquet,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Prepare SpecForge's prompts from configs holding the card's block (and variants)."""
    block = card["data_block"]
    without = "".join(ln for ln in block.splitlines(keepends=True)
                      if not ln.strip().startswith("max_length:"))
    one_short = block.replace(f"max_length: {parquet.longest}",
                              f"max_length: {parquet.longest - 1}")
    assert one_short != block, f"the card's data block has no max_length {parquet.longest}"

    def config(data: str, strategy: str = "eagle3") -> str:
        return SPECFORGE_CONFIG.format(model=card["model"], strategy=strategy) + data

    job = {"scratch": str(tmp_path_factory.mktemp("specforge")), "configs": {
        "card": {"yaml": config(block)},
        # DFlash filters rows itself (two adjacent trained ids at least); its draft's block
        # size is SpecForge's generated default.
        "card_dflash": {"yaml": config(block, "dflash"), "draft_config": {"block_size": 16}},
        "default_max_length": {"yaml": config(without)},
        "one_short": {"yaml": config(one_short)},
    }}
    return _probe(trainer_python, "specforge", job, run_dir, Path(job["scratch"]))


@pytest.fixture(scope="session")
def prepare_data(trainer_python: Path, run_dir: Path, card: dict[str, Any],
                 tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """Run the card's ``speculators prepare-data`` command as it stands, in the run's folder."""
    scratch = tmp_path_factory.mktemp("prepare-data")
    return subprocess.run(card["prepare"], cwd=run_dir, env=trainer_env_vars(scratch),
                          capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="session")
def speculators_out(trainer_python: Path, run_dir: Path, card: dict[str, Any],
                    prepare_data: subprocess.CompletedProcess,
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Load the exports and ``prepare-data``'s output with speculators' own code."""
    assert prepare_data.returncode == 0, (
        f"{shlex.join(card['prepare'])} failed:\n{prepare_data.stderr[-5000:]}")
    prepare = card["prepare"]
    scratch = tmp_path_factory.mktemp("speculators")
    job = {"model": card["model"], "folder": prepare[prepare.index("--data") + 1],
           "seq_length": int(prepare[prepare.index("--seq-length") + 1]),
           "prepared": prepare[prepare.index("--output") + 1],
           "wrong_folder": "./tokenized", "seed": PREPARE_DATA_SEED,
           "train_args": card["train"][2:]}
    return _probe(trainer_python, "speculators", job, run_dir, scratch)


def _differing(got: list, want: list) -> list[int]:
    return [i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w]


def _assert_rows(got: list, parquet: Parquet, reader: str) -> None:
    """Assert ``got`` is the parquet's rows, in order, each input_ids and loss_mask equal."""
    assert len(got) == len(parquet.ids), f"{reader}: {len(got)} rows for {len(parquet.ids)}"
    differ = _differing(got, parquet.rows())
    assert not differ, (f"{reader}: {len(differ)} rows differ from the parquet's, e.g. "
                        f"{[parquet.ids[i] for i in differ[:5]]}")


def test_card_gives_the_runs_longest_row_to_both_trainers(card, parquet):
    data = yaml.safe_load(card["data_block"])["data"]
    prepare = card["prepare"]
    assert data == {"prompts_path": "./pretokenized.jsonl", "max_length": parquet.longest}
    assert prepare[prepare.index("--data") + 1] == "./pretokenized"
    assert int(prepare[prepare.index("--seq-length") + 1]) == parquet.longest


def test_exports_hold_the_parquets_rows_and_only_them(run_dir, parquet):
    whole = [json.loads(line) for line in (run_dir / "pretokenized.jsonl").open()]
    assert [r["id"] for r in whole] == parquet.ids
    assert len(set(parquet.ids)) == len(parquet.ids)
    assert [[r["input_ids"], r["loss_mask"]] for r in whole] == parquet.rows()
    shards = sorted(p.name for p in (run_dir / "tokenized").glob("shard-*.parquet"))
    # speculators reads every .json/.jsonl below the folder it is given
    folder = sorted(p.relative_to(run_dir / "pretokenized").as_posix()
                    for p in (run_dir / "pretokenized").rglob("*") if p.is_file())
    assert folder == [s.replace(".parquet", ".jsonl") for s in shards]


@pytest.mark.parametrize("config", ["card", "card_dflash"])
def test_specforge_reads_every_row_as_the_parquet_holds_it(specforge_out, parquet, config):
    out = specforge_out[config]
    assert out["prompts_path"] == "./pretokenized.jsonl"
    assert out["max_length"] == parquet.longest
    _assert_rows(out["rows"], parquet, f"SpecForge ({out['strategy']})")


def test_specforge_cuts_rows_under_a_shorter_max_length(specforge_out, parquet):
    """SpecForge cuts a longer row without a word: the card's max_length is the least that
    keeps every row whole."""
    rows = parquet.rows()
    default = specforge_out["default_max_length"]
    assert default["max_length"] == SPECFORGE_DEFAULT_MAX_LENGTH
    longer = [i for i, ids in enumerate(parquet.input_ids)
              if len(ids) > SPECFORGE_DEFAULT_MAX_LENGTH]
    assert _differing(default["rows"], rows) == longer

    short = specforge_out["one_short"]
    cut = [i for i, ids in enumerate(parquet.input_ids) if len(ids) == parquet.longest]
    assert cut and _differing(short["rows"], rows) == cut
    assert all(short["rows"][i] == [rows[i][0][:-1], rows[i][1][:-1]] for i in cut)


def test_speculators_passes_every_row_through_in_order(speculators_out, parquet):
    assert speculators_out["raw_ids"] == parquet.ids
    _assert_rows(speculators_out["passthrough"], parquet, "speculators' pass-through")


def test_speculators_prepare_data_as_the_card_says_keeps_every_row(speculators_out, parquet):
    """``prepare-data`` keeps every row exactly, but shuffles them and drops the ids: rows
    are matched through its seeded shuffle, and as a multiset."""
    prepared = speculators_out["prepared"]
    rows = parquet.rows()
    assert speculators_out["prepared_columns"] == ["input_ids", "loss_mask", "seq_len"]
    assert len(prepared) == len(rows)
    key = [(tuple(i), tuple(m)) for i, m in prepared]
    assert Counter(key) == Counter((tuple(i), tuple(m)) for i, m in rows)
    order = speculators_out["prepared_order"]
    assert sorted(order) == list(range(len(rows))) and order != sorted(order)
    unshuffled = [None] * len(rows)
    for k, j in enumerate(order):
        unshuffled[j] = prepared[k]
    _assert_rows(unshuffled, parquet, "prepare-data's output, its shuffle undone")


def test_speculators_train_reads_every_prepared_row(speculators_out, card, parquet):
    """The card's ``train`` line, parsed by speculators' own config: it reads the prepared
    folder, packs sequences at least as long as the longest row, and holds out the last
    rows (``--train-data-ratio``, 0.9 by default) for validation."""
    train = speculators_out["train"]
    prepare = card["prepare"]
    assert Path(train["data_path"]) == Path(prepare[prepare.index("--output") + 1])
    assert train["total_seq_len"] >= parquet.longest
    split = int(len(parquet.ids) * train["train_data_ratio"])
    assert len(train["train"]) == split and train["train"] + train["val"] == \
        speculators_out["prepared"]


def test_speculators_does_not_read_the_tokenized_folder(speculators_out):
    """The folder beside the exports (manifests, conversations) is no pre-tokenized input."""
    assert speculators_out["wrong_folder_error"]
