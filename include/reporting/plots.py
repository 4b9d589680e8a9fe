"""PNG plots of a report: length distributions per source and throughput over time.

Drawn with matplotlib's Agg backend (no display) from the report's own data, plus the raw
lengths it summarises; output bytes carry no timestamp, so a rebuilt report is identical.
"""

from __future__ import annotations

import io
import math
from typing import Any


def _figure(n_panels: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, max(1, n_panels))
    rows = max(1, math.ceil(n_panels / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    fig.suptitle(title)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    # No Software/date metadata: identical inputs give identical bytes (create-only retries).
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def length_histograms(values: dict[str, list[int]], title: str, unit: str) -> bytes:
    """Return a PNG with one histogram per source of ``values`` (source -> lengths)."""
    items = [(src, v) for src, v in sorted(values.items()) if v]
    fig, axes = _figure(max(1, len(items)), title)
    if not items:
        axes[0].text(0.5, 0.5, "no data", ha="center", va="center")
    for ax, (src, v) in zip(axes, items, strict=False):
        ax.hist(v, bins=min(30, max(5, len(set(v)))), color="#4c72b0")
        ax.set_title(f"{src} (n={len(v)})", fontsize=9)
        ax.set_xlabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
    return _png(fig)


def throughput_plot(throughput: dict[str, Any]) -> bytes:
    """Return a PNG of output tokens/s over time, all servers and each server."""
    fig, (ax,) = _figure(1, "Output tokens/s over time")
    fig.set_size_inches(10, 3.6)
    timeline = throughput.get("timeline") or []
    if not timeline:
        ax.text(0.5, 0.5, "no completions in this run", ha="center", va="center")
    else:
        # Repeat the last value at the end of the last bin so every bin is drawn full width.
        t = [p["t_s"] for p in timeline] + [timeline[-1]["t_s"] + timeline[-1]["width_s"]]
        total = [p["output_tokens_per_s"] for p in timeline]
        ax.step(t, total + total[-1:], where="post", label="all", color="black",
                linewidth=1.5)
        for srv in sorted(timeline[0]["per_server"]):
            ys = [p["per_server"][srv] for p in timeline]
            ax.step(t, ys + ys[-1:], where="post", label=srv, linewidth=0.8)
        for n, gap in enumerate(throughput.get("no_request_in_flight") or []):
            ax.axvspan(gap["from_s"], gap["to_s"], color="#bbbbbb", alpha=0.5, linewidth=0,
                       label="no request in flight (between shards)" if n == 0 else None)
        ax.set_xlabel(f"seconds since the first request (bins of {throughput['bin_s']:g} s)")
        ax.set_ylabel("output tokens/s (all servers, and each)")
        ax.set_ylim(bottom=0)
        # Outside the axes: a legend over the lines hides the data it explains.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def render_plots(report: dict[str, Any], raw: dict[str, dict[str, list[int]]]) -> dict[
        str, bytes]:
    """Return ``{file name: PNG bytes}`` for a report and its raw length lists.

    ``raw`` maps ``prompt_tokens``/``completion_tokens``/``tokenized_length`` to per-source
    lists (the values the report's length statistics summarise).
    """
    return {
        "prompt_tokens.png": length_histograms(raw["prompt_tokens"],
                                               "Prompt tokens per source", "tokens"),
        "completion_tokens.png": length_histograms(raw["completion_tokens"],
                                                   "Completion tokens per source", "tokens"),
        "tokenized_length.png": length_histograms(raw["tokenized_length"],
                                                  "Tokenized sample length per source",
                                                  "tokens"),
        "throughput.png": throughput_plot(report["throughput"]),
    }
