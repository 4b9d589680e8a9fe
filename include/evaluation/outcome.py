"""An evaluation's outcome from its journals: figures, report files, the Asset's extra, gate.

Pure but for the store it writes to (create-only, so a retried report task writes the same
bytes or finds them). The gate compares each candidate's gain over the baseline, pooled over
sources (SGLang's acceptance length, bonus token counted), with ``min_gain``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from include.evaluation import keys
from include.evaluation.records import completed
from include.evaluation.report import card_section, markdown, plot_png
from include.evaluation.settings import EvaluationRequest
from include.evaluation.stats import ALL_SOURCES, acceptance, differences, speedups
from include.storage import Store


@dataclass(frozen=True)
class Outcome:
    """What the report task returns (JSON) and the Asset event carries."""

    data: dict[str, Any]

    @property
    def gains(self) -> list[dict[str, Any]]:
        return self.data["gains"]


def build(store: Store, records: dict[str, dict[str, Any]], request: EvaluationRequest,
          dataset_run: str, run_id: str) -> Outcome:
    """Compute the figures and write report.md, the plot, report.json and the card section."""
    done = completed(records)
    figures = acceptance(done, seed=request.seed)
    diffs = differences(done, request.baseline, request.candidate_names, seed=request.seed)
    speeds = (speedups(done, request.drafters, seed=request.seed)
              if request.target_only_pass else [])
    prefix = keys.evaluation_prefix(run_id)
    plot = plot_png(figures)
    page = markdown(dataset_run, figures, diffs, speeds, keys.PLOT_PNG if plot else None)
    section = card_section(dataset_run, run_id, figures, diffs)
    gains = [{"candidate": d.config, "baseline": d.against, "thinking": d.thinking,
              "temperature": d.temperature, "pairs": d.pairs, "gain": d.value.value,
              "low": d.value.low, "high": d.value.high}
             for d in diffs if d.source == ALL_SOURCES]
    data = {
        "dataset_run": dataset_run, "evaluation_id": run_id,
        "report_uri": store.uri(prefix + keys.REPORT_MD),
        "card_section_uri": store.uri(prefix + keys.CARD_SECTION),
        "baseline": request.baseline, "candidates": request.candidate_names,
        "requests": {"completed": len(done), "journaled": len(records)},
        "prompt_sets": _set_prompts(done),
        "min_gain": request.min_gain, "gains": gains,
        "figures": [f.to_dict() for f in figures], "differences": [d.to_dict() for d in diffs],
        "speedups": [s.to_dict() for s in speeds],
        "settings": request.model_dump(mode="json"),
    }
    if plot:
        _write(store, prefix + keys.PLOT_PNG, plot)
    _write(store, prefix + keys.REPORT_MD, page.encode())
    _write(store, prefix + keys.CARD_SECTION, section.encode())
    _write(store, prefix + keys.REPORT_JSON,
           json.dumps(data, indent=1, sort_keys=True).encode())
    return Outcome(data)


def _set_prompts(done: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each named prompt set measured, with how many of its prompts a request completed."""
    prompts: dict[str, set[str]] = {}
    for r in done:
        if r.get("prompt_set"):
            prompts.setdefault(r["prompt_set"], set()).add(r["prompt_id"])
    return {name: len(ids) for name, ids in sorted(prompts.items())}


def _write(store: Store, key: str, data: bytes) -> None:
    # Create-only: a retried report finds its own bytes (same journal, same seed) and keeps them.
    from include.storage import ObjectExistsError

    try:
        store.write_new(key, data)
    except ObjectExistsError:
        if store.read(key) != data:
            raise


def gate_problems(gains: Sequence[dict[str, Any]], min_gain: float | None,
                  candidates: Sequence[str] = ()) -> list[str]:
    """Each candidate x thinking x temperature whose gain is below ``min_gain`` (None: no gate).

    The gain is the point estimate of the paired difference in pooled acceptance length
    (candidate minus baseline, all sources); a candidate of ``candidates`` with no measured
    gain at all fails too (nothing measured is not a gain).
    """
    if min_gain is None:
        return []
    measured = {g["candidate"] for g in gains}
    missing = [f"{c}: no paired figure against the baseline (no request of both completed)"
               for c in candidates if c not in measured]
    return missing + [
            f"{g['candidate']} gains {g['gain']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}] "
            f"acceptance length over {g['baseline']} (thinking "
            f"{'on' if g['thinking'] else 'off'}, T={g['temperature']:g}, {g['pairs']} prompts),"
            f" below min_gain {min_gain:+.3f}"
            for g in gains if g["gain"] < min_gain]
