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
    skipped prompts are never sent), quarantined by a check / completions checked, and
    quarantined by an output quality filter / completions checked (a whole conversation's
    turns are checked one by one, so each counts).
    """

    max_truncation_rate: float = 0.2
    max_failure_rate: float = 0.01
    min_completions_per_source: int = 0
    max_quarantine_rate: float = 0.01
    max_filtered_rate: float = 0.05

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
    #: Said after the figures (e.g. counts by filter); ``hint`` only when the gate failed.
    detail: str = ""
    hint: str = ""

    @property
    def message(self) -> str:
        """Return one line naming the gate, the measured value, the threshold and the shards."""
        ratio = (f" ({self.numerator}/{self.denominator})"
                 if self.denominator is not None else "")
        where = ", ".join(f"{c['name']}: {c['count']}" for c in self.contributors)
        state = "ok" if self.passed else "FAILED"
        if not self.name.startswith("min_"):  # max_* and all_shards_complete: a ceiling
            rule = f"at most {_fmt(self.threshold)} allowed"
            where = f"; most from {where}" if where else ""
        else:
            rule = (f"at least {_fmt(self.threshold)} required" if self.threshold
                    else "no minimum set")
            where = f"; short: {where}" if where else ""
        detail = f"; {self.detail}" if self.detail else ""
        hint = f". {self.hint}" if self.hint and not self.passed else ""
        return (f"{state} {self.name}: measured {_fmt(self.measured)}{ratio}, {rule}{detail}"
                f"{where}{hint}")

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
    filtered_by_reason: dict[str, int] | None = None,
) -> list[GateResult]:
    """Return one result per gate from per-shard counts and completions per source.

    ``per_shard[shard]`` needs ``completed``, ``truncated``, ``failed``, ``quarantined`` (by
    the tokenization checks), ``filtered`` (by the output quality filters) and ``checked``
    (completions the tokenization stage looked at); ``completed_per_source`` every source
    expected to have completions (a source with no completion at all must be present with
    0); ``filtered_by_reason`` the filtered completions per filter, named in the message.
    """
    def total(key: str) -> int:
        return sum(s.get(key, 0) for s in per_shard.values())

    def by_shard(key: str) -> dict[str, int]:
        return {sid: s.get(key, 0) for sid, s in per_shard.items()}

    completed, truncated, failed = total("completed"), total("truncated"), total("failed")
    quarantined, checked, filtered = total("quarantined"), total("checked"), total("filtered")
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
    rate = _rate(quarantined, checked)
    results.append(GateResult("max_quarantine_rate", gates.max_quarantine_rate, rate,
                              rate <= gates.max_quarantine_rate, quarantined, checked,
                              _top(by_shard("quarantined"))))
    results.append(filtered_gate(gates.max_filtered_rate, filtered, checked,
                                 by_shard("filtered"), filtered_by_reason or {}))
    return results


def filtered_gate(threshold: float, filtered: int, checked: int, per_shard: dict[str, int],
                  by_filter: dict[str, int]) -> GateResult:
    """Return the ``max_filtered_rate`` gate: completions the output quality filters kept out.

    Apart from ``max_quarantine_rate``: a target that loops in a few completions is a fact
    about the model, not a pipeline bug, and gets its own, looser threshold.
    """
    rate = _rate(filtered, checked)
    counts = ", ".join(f"{k} {v}" for k, v in by_filter.items() if v)
    worst = max(by_filter, key=lambda k: by_filter[k], default="") if counts else ""
    hint = ("To train without a filter, turn it off with quality_filters_off: "
            f"[{worst or '<filter>'}]; to accept more, raise max_filtered_rate")
    return GateResult("max_filtered_rate", threshold, rate, rate <= threshold, filtered,
                      checked, _top(per_shard),
                      detail=f"by filter: {counts}" if counts else "", hint=hint)


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
