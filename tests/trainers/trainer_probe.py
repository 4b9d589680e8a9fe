"""Run the trainers' own loaders on a run's exports; write what they return as JSON.

Runs in the trainer venv (``.venv-trainers/bin/python``; scripts/trainer_env.py), never in
the project's: it imports only SpecForge, speculators and what they need. The tier
(``test_trainers_read_the_run.py``) gives it a job (JSON) and compares the rows it writes with
the run's parquet.

    python trainer_probe.py specforge JOB OUT     SpecForge's config and prompt preparation
    python trainer_probe.py speculators JOB OUT   speculators' data loading and training data

The working directory is the run's folder, as for a user who pastes the card's snippets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _rows(records: Any) -> list[list[list[int]]]:
    return [[list(map(int, r["input_ids"])), list(map(int, r["loss_mask"]))] for r in records]


def specforge(job: dict[str, Any]) -> dict[str, Any]:
    """Prepare each job config's prompts as ``specforge train`` does, from its config file.

    ``_prepare_prompts`` is the call SpecForge's training assembly makes (it names the
    config's ``data`` fields and the algorithm's loss filters); the tokenizer is the
    target's, as SpecForge loads it.
    """
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.config.schema import load_config
    from specforge.training.assembly import _prepare_prompts
    from transformers import AutoTokenizer

    registry = builtin_algorithm_registry()
    out: dict[str, Any] = {}
    for name, case in job["configs"].items():
        path = Path(job["scratch"]) / f"{name}.yaml"
        path.write_text(case["yaml"])
        cfg = load_config(str(path))
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.target_model_path)
        registration = registry.resolve(cfg.training.strategy)
        tasks = _prepare_prompts(cfg, tokenizer, algorithm=registration,
                                 draft_config=case.get("draft_config"))
        out[name] = {"strategy": cfg.training.strategy, "max_length": cfg.data.max_length,
                     "prompts_path": cfg.data.prompts_path,
                     "rows": _rows(t["payload"] for t in tasks)}
    return out


def _double_seed_shuffle(n: int, seed: int) -> list[int]:
    """Return the raw row each ``prepare-data`` output row is.

    ``load_and_preprocess_dataset`` shuffles each input with ``seed``, then the concatenation
    with ``seed`` again; a seeded ``datasets`` shuffle is a permutation of the row count alone.
    """
    from datasets import Dataset

    once = Dataset.from_dict({"i": list(range(n))}).shuffle(seed=seed)
    return list(once.shuffle(seed=seed)["i"])


def speculators(job: dict[str, Any]) -> dict[str, Any]:
    """Load the exports as speculators does: the pass-through, ``prepare-data``'s output, and
    the datasets its training reads from that output."""
    from datasets import load_from_disk
    from speculators.data_generation.preprocessing import (
        build_speculator_training_dataset,
        load_processor,
        load_raw_dataset,
    )
    from speculators.train.config import TrainConfig
    from speculators.train.data import ArrowDataset

    processor = load_processor(job["model"])
    raw, _ = load_raw_dataset(job["folder"])
    passed = build_speculator_training_dataset(raw, processor, max_length=job["seq_length"],
                                               num_proc=1)
    out: dict[str, Any] = {
        "raw_columns": raw.column_names, "raw_ids": list(raw["id"]),
        "passthrough": _rows(passed.with_format(None)),
    }
    try:
        other, _ = load_raw_dataset(job["wrong_folder"])
        build_speculator_training_dataset(other, processor, max_length=job["seq_length"],
                                          num_proc=1)
        out["wrong_folder_error"] = None
    except Exception as exc:  # noqa: BLE001 - what a user sees, whatever it is
        out["wrong_folder_error"] = f"{type(exc).__name__}: {exc}"[:500]

    prepared = load_from_disk(job["prepared"]).with_format(None)
    out["prepared_columns"] = prepared.column_names
    out["prepared"] = _rows(prepared)
    out["prepared_order"] = _double_seed_shuffle(len(raw), job["seed"])
    train = TrainConfig.resolve(job["train_args"])
    out["train"] = {"data_path": train.data.data_path, "total_seq_len": train.data.total_seq_len,
                    "train_data_ratio": train.data.train_data_ratio}
    for split in ("train", "val"):
        ds = ArrowDataset(max_len=train.data.total_seq_len, datapath=train.data.data_path,
                          train_ratio=train.data.train_data_ratio, split=split,
                          on_missing="skip")
        out["train"][split] = _rows(ds.data.with_format(None))
    return out


def main() -> int:
    """Run one probe; return the exit code."""
    command, job_path, out_path = sys.argv[1:4]
    job = json.loads(Path(job_path).read_text())
    result = {"specforge": specforge, "speculators": speculators}[command](job)
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
