"""Quality gates: thresholds a finished run must meet before its dataset is published.

Each gate compares one measured figure of the report with one threshold and, when broken,
names the shards (or sources) that contributed most, so the failure message says where to look.
A gate passes when the measured value is at or under its maximum (at or over its minimum).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class QualityGateError(RuntimeError):
    """A run broke at least one quality gate; the message names each gate, value and shards."""


@dataclass(frozen=True)
class QualityGates:
    """The thresholds of one run (defaults match the proposed settings of the same names).

    Rates are fractions in [0, 1]: truncated / completed, failed / sent (completed + failed;
    skipped prompts are never sent), quarantined / tokenizer input records.
    """

    max_truncation_rate: float = 0.2
    max_failure_rate: float = 0.01
    min_completions_per_source: int = 0
    max_quarantine_rate: float = 0.01

    @classmethod
    def from_settings(cls, settings: Any) -> QualityGates:
        """Read the gates from ``RunSettings`` once it has them; defaults for missing ones."""
        defaults = cls()
        return cls(**{
            name: getattr(settings, name, getattr(defaults, name))
            for name in asdict(defaults)
        })


@dataclass
class GateResult:
    """The outcome of one gate; ``contributors`` are the top shards (or sources) by count."""

    name: str
    threshold: float
    measured: float
    passed: bool
    numerator: int | None
    denominator: int | None
    contributors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def message(self) -> str:
        """Return one line naming the gate, the measured value, the threshold and the shards."""
        ratio = (f" ({self.numerator}/{self.denominator})"
                 if self.denominator is not None else "")
        where = ", ".join(f"{c['name']}: {c['count']}" for c in self.contributors)
        state = "ok" if self.passed else "FAILED"
        if self.name.startswith("max_"):
            rule = f"at most {_fmt(self.threshold)} allowed"
            where = f"; most from {where}" if where else ""
        else:
            rule = (f"at least {_fmt(self.threshold)} required" if self.threshold
                    else "no minimum set")
            where = f"; short: {where}" if where else ""
        return f"{state} {self.name}: measured {_fmt(self.measured)}{ratio}, {rule}{where}"

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready data including the message."""
        return {**asdict(self), "message": self.message}


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def _top(counts: dict[str, int], n: int = 5) -> list[dict[str, Any]]:
    ranked = sorted(((k, v) for k, v in counts.items() if v), key=lambda kv: (-kv[1], kv[0]))
    return [{"name": k, "count": v} for k, v in ranked[:n]]


def evaluate_gates(
    gates: QualityGates,
    per_shard: dict[str, dict[str, int]],
    completed_per_source: dict[str, int],
) -> list[GateResult]:
    """Return one result per gate from per-shard counts and completions per source.

    ``per_shard[shard]`` needs ``completed``, ``truncated``, ``failed``, ``quarantined`` and
    ``tokenizer_input``; ``completed_per_source`` every source expected to have completions
    (a source with no completion at all must be present with 0).
    """
    def total(key: str) -> int:
        return sum(s.get(key, 0) for s in per_shard.values())

    def by_shard(key: str) -> dict[str, int]:
        return {sid: s.get(key, 0) for sid, s in per_shard.items()}

    completed, truncated, failed = total("completed"), total("truncated"), total("failed")
    quarantined, tok_input = total("quarantined"), total("tokenizer_input")
    results = []
    rate = _rate(truncated, completed)
    results.append(GateResult("max_truncation_rate", gates.max_truncation_rate, rate,
                              rate <= gates.max_truncation_rate, truncated, completed,
                              _top(by_shard("truncated"))))
    sent = completed + failed
    rate = _rate(failed, sent)
    results.append(GateResult("max_failure_rate", gates.max_failure_rate, rate,
                              rate <= gates.max_failure_rate, failed, sent,
                              _top(by_shard("failed"))))
    fewest = min(completed_per_source.values(), default=0)
    short = {src: n for src, n in completed_per_source.items()
             if n < gates.min_completions_per_source}
    # The sources under the minimum, fewest first: those are what to look at.
    shortest = sorted(short.items(), key=lambda kv: (kv[1], kv[0]))[:5]
    results.append(GateResult("min_completions_per_source", gates.min_completions_per_source,
                              fewest, not short, None, None,
                              [{"name": k, "count": v} for k, v in shortest]))
    rate = _rate(quarantined, tok_input)
    results.append(GateResult("max_quarantine_rate", gates.max_quarantine_rate, rate,
                              rate <= gates.max_quarantine_rate, quarantined, tok_input,
                              _top(by_shard("quarantined"))))
    return results


def raise_for_gates(report: dict[str, Any]) -> None:
    """Raise QualityGateError naming every broken gate of a built report; return if it passed."""
    broken = [g for g in report["gates"] if not g["passed"]]
    if broken:
        where = report.get("report_uri", "the run's report")
        raise QualityGateError(
            f"run {report['run']['run_name']} failed {len(broken)} quality gate(s):\n"
            + "\n".join("  " + g["message"] for g in broken)
            + f"\nOutputs are kept; see {where}. The dataset asset was not updated."
        )
