"""The figures a training team decides from, each with a seeded bootstrap interval.

Definitions (stated in every report, since tools differ: vllm #42508):

- **acceptance length** is SGLang 0.5.23's (``tokenizer_manager.py``
  ``_calculate_spec_decoding_metrics``): output tokens per verify pass, so it **counts the bonus
  token** (and the prefill's first token); pooled over a group as sum(output tokens) /
  sum(verify passes), the per-request figure weighted by its verify passes. A drafter that never
  hits is near 1.
- **acceptance rate**: sum(correct drafts) / sum(proposed drafts), **without** the bonus token.
- **speedup**: output tokens per second of latency against the target-only pass on the same
  prompts (a ratio of pooled rates, client-measured, at the pass's concurrency).

Intervals: percentile bootstrap over requests (the independent unit), ``n_boot`` resamples
from ``numpy.random.default_rng(seed)``; differences and speedups resample prompts paired
across the two configurations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from include.evaluation.records import TARGET_ONLY

ALL_SOURCES = "(all)"


@dataclass(frozen=True)
class Estimate:
    """A pooled ratio with its interval."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


@dataclass(frozen=True)
class GroupFigures:
    """One configuration x source x thinking mode x temperature."""

    config: str
    source: str
    thinking: bool
    temperature: float
    requests: int
    output_tokens: int
    verify_ct: int
    accept_length: Estimate
    accept_rate: Estimate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """A candidate against a reference on the prompts both answered."""

    config: str
    against: str
    source: str
    thinking: bool
    temperature: float
    pairs: int
    value: Estimate  # accept-length difference, or the speedup ratio

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _interval(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int,
              level: float) -> Estimate:
    value = float(num.sum() / den.sum())
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))
    boot = num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1e-12)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return Estimate(value, float(low), float(high))


def _sources(record: dict[str, Any]) -> tuple[str, ...]:
    # A named prompt set is its own row only: "(all)" pools the run's held-out split, so the
    # gate and the card's pooled figures measure the run's data and nothing the deployment adds.
    if record.get("prompt_set"):
        return (record["source"],)
    return (record["source"], ALL_SOURCES)


def _groups(records: Iterable[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        for source in _sources(r):
            out[(r["config"], source, r["thinking"], r["temperature"])].append(r)
    return out


def acceptance(records: list[dict[str, Any]], *, seed: int, n_boot: int = 2000,
               level: float = 0.95) -> list[GroupFigures]:
    """Per configuration x source x thinking x temperature (and all sources pooled)."""
    rng = np.random.default_rng(seed)
    figures = []
    for (config, source, thinking, temp), group in sorted(_groups(
            r for r in records if r.get("spec")).items(), key=lambda kv: str(kv[0])):
        tokens = np.array([r["completion_tokens"] for r in group], dtype=float)
        verify = np.array([r["spec"]["verify_ct"] for r in group], dtype=float)
        correct = np.array([r["spec"]["num_correct_drafts"] for r in group], dtype=float)
        proposed = np.array([r["spec"]["num_proposed_drafts"] for r in group], dtype=float)
        figures.append(GroupFigures(
            config, source, thinking, temp, len(group), int(tokens.sum()), int(verify.sum()),
            _interval(tokens, verify, rng, n_boot, level),
            _interval(correct, proposed, rng, n_boot, level)))
    return figures


def _paired(records: list[dict[str, Any]], a: str, b: str,
            need_spec: bool) -> dict[tuple, list[tuple[dict, dict]]]:
    by_key: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in records:
        if need_spec and not r.get("spec"):
            continue
        by_key[(r["prompt_id"], r["thinking"], r["temperature"])][r["config"]] = r
    out: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for (_, thinking, temp), configs in by_key.items():
        if a in configs and b in configs:
            pair = (configs[a], configs[b])
            for source in _sources(pair[0]):
                out[(source, thinking, temp)].append(pair)
    return out


def _paired_interval(stat, pairs: list[tuple[dict, dict]], rng: np.random.Generator,
                     n_boot: int, level: float) -> Estimate:
    value = stat(pairs)
    n = len(pairs)
    boot = [stat([pairs[i] for i in rng.integers(0, n, size=n)]) for _ in range(n_boot)]
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return Estimate(float(value), float(low), float(high))


def _length_difference(pairs: list[tuple[dict, dict]]) -> float:
    def pooled(side: int) -> float:
        return (sum(p[side]["completion_tokens"] for p in pairs)
                / sum(p[side]["spec"]["verify_ct"] for p in pairs))
    return pooled(0) - pooled(1)


def _speedup(pairs: list[tuple[dict, dict]]) -> float:
    def rate(side: int) -> float:
        return (sum(p[side]["completion_tokens"] for p in pairs)
                / max(sum(p[side]["latency_s"] for p in pairs), 1e-9))
    return rate(0) / rate(1)


def differences(records: list[dict[str, Any]], baseline: str, candidates: list[str], *,
                seed: int, n_boot: int = 1000, level: float = 0.95) -> list[Comparison]:
    """Each candidate's acceptance length minus the baseline's, paired on prompts."""
    rng = np.random.default_rng(seed)
    out = []
    for cand in candidates:
        for (source, thinking, temp), pairs in sorted(
                _paired(records, cand, baseline, True).items(), key=lambda kv: str(kv[0])):
            out.append(Comparison(cand, baseline, source, thinking, temp, len(pairs),
                                  _paired_interval(_length_difference, pairs, rng, n_boot,
                                                   level)))
    return out


def speedups(records: list[dict[str, Any]], configs: list[str], *, seed: int,
             n_boot: int = 1000, level: float = 0.95) -> list[Comparison]:
    """Each configuration's output tokens per latency second over the target-only pass's."""
    rng = np.random.default_rng(seed)
    out = []
    for config in configs:
        pairs_by = _paired(records, config, TARGET_ONLY, False)
        for key in sorted(k for k in pairs_by if k[0] == ALL_SOURCES):
            pairs = pairs_by[key]
            out.append(Comparison(config, TARGET_ONLY, *key, len(pairs),
                                  _paired_interval(_speedup, pairs, rng, n_boot, level)))
    return out
