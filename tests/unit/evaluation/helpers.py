"""Write a dataset run's held-out split as the prepare stage will (the INTERFACE of issue 36)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from include.layout import EVAL_PROMPTS_KEY


def write_split(run: Path, prompts: list[dict[str, Any]], seed: int = 7,
                manifest: dict[str, Any] | None = None) -> None:
    (run / EVAL_PROMPTS_KEY).parent.mkdir(parents=True, exist_ok=True)
    (run / EVAL_PROMPTS_KEY).write_text("".join(json.dumps(p) + "\n" for p in prompts))
    per_source: dict[str, int] = {}
    for p in prompts:
        per_source[p["source"]] = per_source.get(p["source"], 0) + 1
    (run / "eval" / "manifest.json").write_text(json.dumps(manifest or {
        "split": "eval", "seed": seed, "per_source": per_source, "count": len(prompts)}))


def prompt(i: int, source: str, text: str | None = None) -> dict[str, Any]:
    return {"id": f"{source}-{i:04d}", "source": source, "metadata": {},
            "messages": [{"role": "user", "content": text or f"{source} question {i}"}]}
