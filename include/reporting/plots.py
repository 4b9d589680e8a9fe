"""PNG plots of a report: length distributions per source and throughput over time.

Drawn with matplotlib's Agg backend (no display) from the report's own data, plus the raw
lengths it summarises; output bytes carry no timestamp, so a rebuilt report is identical.
"""

from __future__ import annotations

import io
import math
from typing import Any

from include.reporting.throughput import server_time_shares


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


def _png(fig: Any, layout: bool = True) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    if layout:
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


def _cut_axis(gaps: list[dict[str, float]]) -> Any:
    """Return t (seconds since the first request) -> x, with the between-task gaps cut out."""
    cuts = [(g["from_s"], g["to_s"] - g["from_s"]) for g in gaps]

    def x(t: float) -> float:
        return t - sum(min(length, max(t - at, 0.0)) for at, length in cuts)

    return x


def throughput_figure(throughput: dict[str, Any]) -> Any:
    """Return the throughput figure: tokens/s and what the servers did, gaps cut out.

    Top: output tokens/s per bin, all servers and each. Bottom: the mean number of servers
    busy and idle per bin. Time between tasks (no shard generating) is cut out of the axis
    and marked; the legend gives ``server_time_shares``, the numbers the report's text gives.
    """
    fig, (ax,) = _figure(1, "Output tokens/s and what the servers did")
    timeline = throughput.get("timeline") or []
    st = throughput.get("server_time")
    if not timeline or not st:
        fig.set_size_inches(10, 3.6)
        ax.text(0.5, 0.5, "no completions in this run", ha="center", va="center")
        return fig
    fig.set_size_inches(10, 5.2)
    ax.set_position([0.08, 0.42, 0.6, 0.44])
    state = fig.add_axes([0.08, 0.1, 0.6, 0.24], sharex=ax)
    x = _cut_axis(st["between_tasks"])
    segments = sorted({p["segment"] for p in timeline})
    first = True
    for seg in segments:
        pts = [p for p in timeline if p["segment"] == seg]
        # Each segment drawn on its own: a line never joins two sides of a gap.
        xs = [x(p["t_s"]) for p in pts] + [x(pts[-1]["t_s"]) + pts[-1]["width_s"]]
        total = [p["output_tokens_per_s"] for p in pts]
        ax.step(xs, total + total[-1:], where="post", color="black", linewidth=1.5,
                label="all servers" if first else None)
        for n, srv in enumerate(sorted(pts[0]["per_server"])):
            ys = [p["per_server"][srv] for p in pts]
            ax.step(xs, ys + ys[-1:], where="post", linewidth=0.8, color=f"C{n % 10}",
                    label=srv if first else None)
        lefts = [x(p["t_s"]) for p in pts]
        widths = [p["width_s"] for p in pts]
        busy = [p["busy_servers"] for p in pts]
        state.bar(lefts, busy, widths, align="edge", color="#55a868", linewidth=0,
                  label=None)
        state.bar(lefts, [p["idle_servers"] for p in pts], widths, bottom=busy,
                  align="edge", color="#dd8452", linewidth=0, label=None)
        first = False
    shares = server_time_shares(throughput)
    gaps = st["between_tasks"]
    for g in gaps:
        at = x(g["from_s"])
        for a in (ax, state):
            a.axvline(at, color="#777777", linestyle=(0, (2, 2)), linewidth=1.0)
        if len(gaps) <= 12:
            ax.annotate(f"+{g['to_s'] - g['from_s']:,.0f} s", (at, 1.0),
                        xycoords=("data", "axes fraction"), fontsize=7, ha="center",
                        va="bottom", color="#555555")
    # Proxy artists: the legend names each state with its share of server time.
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(color="#55a868", label=f"busy (a request in flight) {shares['busy']:.1%}"),
        Patch(color="#dd8452",
              label=f"idle (nothing in flight, a shard generating) {shares['idle']:.1%}"),
        Line2D([], [], color="#777777", linestyle=(0, (2, 2)),
               label=f"between tasks (no shard generating; cut out) "
                     f"{shares['between_tasks']:.1%}"),
    ]
    state.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                 borderaxespad=0, title="share of server time", title_fontsize=7)
    state.set_ylim(0, max(st["servers"], 1))
    state.set_ylabel("servers", fontsize=8)
    state.set_xlabel(f"seconds of shard generation, gaps between tasks cut out (bins of "
                     f"{throughput['bin_s']:g} s)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.tick_params(labelbottom=False)
    # Outside the axes: a legend over the lines hides the data it explains.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def throughput_plot(throughput: dict[str, Any]) -> bytes:
    """Return a PNG of output tokens/s and server states over time (``throughput_figure``)."""
    return _png(throughput_figure(throughput), layout=False)


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
