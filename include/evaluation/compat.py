"""Whether a drafter fits the target, read from both ``config.json`` files (issue 36, item 4).

A drafter trained for another target loads on SGLang only to accept nothing, or fails deep in
the draft worker: the vocabulary (its ``vocab_size``; EAGLE-3's smaller ``draft_vocab_size``
maps into it), the hidden states it reads (``target_hidden_size`` when the drafter names it,
else its ``hidden_size``), the target architecture when the drafter names one
(``target_architectures`` / ``target_model_type``), and DFlash's target layers
(``dflash_config.target_layer_ids``, SGLang 0.5.23 ``speculative/dflash_utils.py``) must all
fit. A key the drafter does not state is not guessed: only what it states is checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_config(directory: str) -> dict[str, Any] | None:
    """Return ``directory/config.json`` parsed, or None when there is none."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def _text(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal targets keep the language model's sizes under text_config.
    return config.get("text_config") or config


def drafter_problems(name: str, drafter: dict[str, Any] | None,
                     target: dict[str, Any]) -> list[str]:
    """Return why drafter ``name`` does not fit ``target`` (empty: it fits)."""
    if drafter is None:
        return [f"drafter {name!r} has no config.json: its fit to the target cannot be checked"]
    t = _text(target)
    problems = []
    if drafter.get("vocab_size") != t.get("vocab_size"):
        problems.append(f"drafter {name!r} has vocab_size {drafter.get('vocab_size')}, the "
                        f"target {t.get('vocab_size')}: it was trained for another tokenizer")
    hidden = drafter.get("target_hidden_size") or drafter.get("hidden_size")
    if hidden != t.get("hidden_size"):
        problems.append(f"drafter {name!r} reads hidden states of size {hidden}, the target's "
                        f"are {t.get('hidden_size')}")
    archs = drafter.get("target_architectures")
    if archs and not set(archs) & set(target.get("architectures") or []):
        problems.append(f"drafter {name!r} was made for {archs}, the target is "
                        f"{target.get('architectures')}")
    model_type = drafter.get("target_model_type")
    if model_type and model_type != target.get("model_type"):
        problems.append(f"drafter {name!r} was made for model_type {model_type!r}, the "
                        f"target is {target.get('model_type')!r}")
    layers = (drafter.get("dflash_config") or {}).get("target_layer_ids") or []
    depth = t.get("num_hidden_layers")
    if layers and isinstance(depth, int) and max(layers) >= depth:
        problems.append(f"drafter {name!r} reads target layers {layers}, the target has "
                        f"{depth}")
    return problems
