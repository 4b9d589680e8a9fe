"""The evaluation's report: markdown tables, one plot, and the dataset card's section."""

from __future__ import annotations

import io
from collections.abc import Sequence

from include.evaluation.records import is_named_set
from include.evaluation.stats import ALL_SOURCES, Comparison, Estimate, GroupFigures

DEFINITIONS = (
    "Acceptance length is SGLang 0.5.23's `spec_accept_length`: output tokens per verify pass, "
    "**counting the bonus token** (and the prefill's first token), pooled as sum(output "
    "tokens) / sum(verify passes). Acceptance rate is `spec_accept_rate`: correct drafts / "
    "proposed drafts, **without** the bonus token. Intervals: 95 % percentile bootstrap over "
    "requests (paired over prompts for differences and speedups), seeded.")
NAMED_SETS = (
    "Sources `set:<name>` are prompt sets the deployment names (REGEN_ALLOWED_PROMPT_SETS: "
    "public benchmarks such as MT-Bench, GSM8K, HumanEval), first user turn only: **not this "
    "run's data**, never pooled into `(all)`, the gate or the speedup.")


def _est(e: Estimate, digits: int = 2) -> str:
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def _mode(thinking: bool) -> str:
    return "on" if thinking else "off"


def _source(source: str) -> str:
    return f"{source} (named set)" if is_named_set(source) else source


def _figure_table(figures: Sequence[GroupFigures]) -> list[str]:
    return ["| drafter | source | thinking | T | requests | acceptance length | "
            "acceptance rate |", "|---|---|---|---|---|---|---|"] + [
        f"| {f.config} | {_source(f.source)} | {_mode(f.thinking)} | {f.temperature:g} | "
        f"{f.requests} | {_est(f.accept_length)} | {_est(f.accept_rate, 3)} |"
        for f in figures]


def markdown(run_name: str, figures: Sequence[GroupFigures], diffs: Sequence[Comparison],
             speedups: Sequence[Comparison], plot_name: str | None = None) -> str:
    """The report page (``report.md``)."""
    lines = [f"# Drafter evaluation on `{run_name}` (held-out split)", "", DEFINITIONS, "",
             "## Acceptance per drafter x source x thinking mode", ""]
    lines += _figure_table([f for f in figures if not is_named_set(f.source)])
    named = [f for f in figures if is_named_set(f.source)]
    if named:
        lines += ["", "## Acceptance on the deployment's named prompt sets (not this run's "
                  "data)", "", NAMED_SETS, ""]
        lines += _figure_table(named)
    if diffs:
        lines += ["", "## Candidates against the baseline (acceptance length difference)", "",
                  "| candidate | baseline | source | thinking | T | prompts | difference |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {d.config} | {d.against} | {_source(d.source)} | {_mode(d.thinking)} | "
                  f"{d.temperature:g} | {d.pairs} | {_est(d.value)} |"
                  for d in sorted(diffs, key=lambda d: is_named_set(d.source))]
    if speedups:
        lines += ["", "## Speedup over the target-only pass (output tokens per second)", "",
                  "| drafter | thinking | T | prompts | speedup |", "|---|---|---|---|---|"]
        lines += [f"| {s.config} | {_mode(s.thinking)} | {s.temperature:g} | {s.pairs} | "
                  f"{_est(s.value)}x |" for s in speedups]
    if plot_name:
        lines += ["", f"![acceptance length per source]({plot_name})"]
    return "\n".join(lines) + "\n"


def card_section(run_name: str, evaluation_id: str, figures: Sequence[GroupFigures],
                 diffs: Sequence[Comparison]) -> str:
    """The dataset card's "Measured value" section for one evaluation of this run."""
    pooled = [f for f in figures if f.source == ALL_SOURCES]
    lines = [f"## Measured value ({evaluation_id})", "",
             f"Drafters measured on the held-out split of `{run_name}` (never in a training "
             "export). " + DEFINITIONS, ""]
    lines += [f"- `{f.config}`, thinking {_mode(f.thinking)}, T={f.temperature:g}: acceptance "
              f"length {_est(f.accept_length)}, rate {_est(f.accept_rate, 3)} "
              f"({f.requests} requests)" for f in pooled]
    lines += [f"- `{d.config}` - `{d.against}`, thinking {_mode(d.thinking)}, "
              f"T={d.temperature:g}: {_est(d.value)} ({d.pairs} prompts)"
              for d in diffs if d.source == ALL_SOURCES]
    named = [f for f in figures if is_named_set(f.source)]
    if named:
        lines += ["", "On the deployment's named prompt sets (public benchmarks, first turn; "
                  "**not this dataset**, not in the figures above):", ""]
        lines += [f"- `{f.config}` on {f.source}, thinking {_mode(f.thinking)}, "
                  f"T={f.temperature:g}: acceptance length {_est(f.accept_length)}, rate "
                  f"{_est(f.accept_rate, 3)} ({f.requests} requests)" for f in named]
    return "\n".join(lines) + "\n"


def plot_png(figures: Sequence[GroupFigures]) -> bytes:
    """Acceptance length with its interval, per source, one bar per drafter and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = sorted({f.source for f in figures})
    series = sorted({(f.config, f.thinking, f.temperature) for f in figures}, key=str)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(sources) * max(1, len(series)) / 2), 4))
    width = 0.8 / max(1, len(series))
    for k, (config, thinking, temp) in enumerate(series):
        xs, ys, errs = [], [], [[], []]
        for i, source in enumerate(sources):
            f = next((f for f in figures if (f.config, f.source, f.thinking, f.temperature)
                      == (config, source, thinking, temp)), None)
            if f is None:
                continue
            xs.append(i + k * width)
            ys.append(f.accept_length.value)
            errs[0].append(f.accept_length.value - f.accept_length.low)
            errs[1].append(f.accept_length.high - f.accept_length.value)
        ax.bar(xs, ys, width, yerr=errs, capsize=3,
               label=f"{config} (thinking {_mode(thinking)}, T={temp:g})")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sources))], sources, rotation=20)
    ax.set_ylabel("acceptance length (tokens / verify, bonus counted)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
