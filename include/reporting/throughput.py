"""The report's timing figures: throughput over time and per server, drains, retries, gaps.

Pure functions over the completions of the shards this run produced (``collect.py`` reads
their journals: ``finished_at``, ``latency_s``, ``attempts``, server, usage).
"""

from __future__ import annotations

import math
from typing import Any

from include.reporting.collect import ShardFacts


def _nice_bin(wall_s: float, bins: int = 60) -> float:
    raw = max(wall_s / bins, 1.0)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if raw <= step:
            return float(step)
    return 3600.0 * math.ceil(raw / 3600)


def throughput(produced: list[ShardFacts]) -> dict[str, Any]:
    """Return throughput over time and per server, drains and retries of produced shards."""
    comps = [c for s in produced for c in s.completions if c.finished_at]
    retries = {
        "extra_attempts": sum(c.attempts - 1 for s in produced for c in s.completions)
        + sum(a - 1 for s in produced for a in s.failed_attempts),
        "prompts_retried": sum(c.attempts > 1 for s in produced for c in s.completions)
        + sum(a > 1 for s in produced for a in s.failed_attempts),
    }
    if not comps:
        return {"wall_s": 0.0, "output_tokens": 0, "output_tokens_per_s": 0.0, "bin_s": 0,
                "timeline": [], "per_server": {}, "drains": {"per_shard": {}}, "retries": retries}
    start = min(c.finished_at - c.latency_s for c in comps)
    end = max(c.finished_at for c in comps)
    wall = max(end - start, 1e-9)
    out_tokens = sum(c.completion_tokens for c in comps)
    bin_s = _nice_bin(wall)
    n_bins = max(1, math.ceil(wall / bin_s))
    servers = sorted({c.server for c in comps})
    series = {srv: [0] * n_bins for srv in servers}
    for c in comps:
        i = min(n_bins - 1, int((c.finished_at - start) / bin_s))
        series[c.server][i] += c.completion_tokens
    # The last bin is cut at the end of the run; rates divide by each bin's real width.
    widths = [max(min(bin_s, wall - i * bin_s), 1e-9) for i in range(n_bins)]
    timeline = [
        {"t_s": round(i * bin_s, 3), "width_s": round(widths[i], 3),
         "output_tokens_per_s": round(sum(series[s][i] for s in servers) / widths[i], 2),
         "per_server": {s: round(series[s][i] / widths[i], 2) for s in servers}}
        for i in range(n_bins)
    ]
    per_server = {}
    for srv in servers:
        mine = [c for c in comps if c.server == srv]
        last = max(c.finished_at for c in mine)
        tokens = sum(c.completion_tokens for c in mine)
        per_server[srv] = {
            "completed": len(mine), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 2),
            "first_start_s": round(min(c.finished_at - c.latency_s for c in mine) - start, 3),
            "last_finish_s": round(last - start, 3),
            # Time this server sat idle at the end while others finished their last requests.
            "idle_tail_s": round(end - last, 3),
        }
    per_shard = {}
    for s in produced:
        mine = [c for c in s.completions if c.finished_at]
        if not mine:
            continue
        last_start = max(c.finished_at - c.latency_s for c in mine)
        last_finish = max(c.finished_at for c in mine)
        per_shard[s.shard_id] = {"drain_s": round(max(last_finish - last_start, 0.0), 3)}
    last_start = max(c.finished_at - c.latency_s for c in comps)
    idle = sum(v["idle_tail_s"] for v in per_server.values())
    drains = {
        "per_shard": per_shard,
        "run_drain_s": round(max(end - last_start, 0.0), 3),
        "idle_server_seconds": round(idle, 3),
        "idle_fraction": round(idle / (wall * len(servers)), 4),
    }
    return {
        "start": round(start, 3), "end": round(end, 3), "wall_s": round(wall, 3),
        "output_tokens": out_tokens, "output_tokens_per_s": round(out_tokens / wall, 2),
        "bin_s": bin_s, "timeline": timeline, "per_server": per_server, "drains": drains,
        "retries": retries, "no_request_in_flight": idle_gaps(comps, start),
    }


def idle_gaps(comps: list[Any], start: float, min_s: float = 0.5) -> list[dict[str, float]]:
    """Return the spans (seconds from ``start``) when no request was in flight on any server.

    Such a span is time between shards (no shard task running: the scheduler, a worker slot,
    a staggered start), told apart from a server idling while others work.
    """
    spans = sorted((c.finished_at - c.latency_s, c.finished_at) for c in comps)
    gaps, reach = [], spans[0][1]
    for lo, hi in spans[1:]:
        if lo - reach >= min_s:
            gaps.append({"from_s": round(reach - start, 3), "to_s": round(lo - start, 3)})
        reach = max(reach, hi)
    return gaps
