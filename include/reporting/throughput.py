"""The report's timing figures: throughput over time and per server, server time, drains, retries.

Pure functions over the completions of the shards this run produced (``collect.py`` reads
their journals: ``finished_at``, ``latency_s``, ``attempts``, server, usage).

Server time has one set of definitions, used by the text and the plot alike
(``server_time``, ``describe_server_time``): over the run's wall time, each server that
answered is **busy** while it has a request in flight, **idle** while a shard is generating
but it has nothing in flight, and **between tasks** while no shard is generating (a shard
generates from its first request's start to its last request's finish; under ``dags test``
shards run one after another, and the scheduler's time between them is no server's fault).
The timeline's bins lie inside the generating segments, never across a gap between them;
each bin's rate spreads a request's tokens over the time it was in flight and divides by
the bin's real width, so a short last bin shows the rate the servers had, not a spike.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the monitor imports this module without the collector
    from include.reporting.collect import ShardFacts

Span = tuple[float, float]


def _nice_bin(wall_s: float, bins: int = 60) -> float:
    raw = max(wall_s / bins, 1.0)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if raw <= step:
            return float(step)
    return 3600.0 * math.ceil(raw / 3600)


def _union(spans: list[Span]) -> list[Span]:
    """Return the sorted union of closed spans (touching spans merge)."""
    out: list[list[float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _span(c: Any) -> Span:
    return (c.finished_at - c.latency_s, c.finished_at)


def generation_span(manifest: dict[str, Any] | None) -> tuple[float, float, int] | None:
    """Return a shard's generation as its generated manifest records it, ``(started_at,
    finished_at, output tokens)`` of its generate call, or None (a manifest from before)."""
    g = (manifest or {}).get("generation") or {}
    if not (g.get("started_at") and g.get("finished_at")):
        return None
    return float(g["started_at"]), float(g["finished_at"]), int(g.get("output_tokens") or 0)


def busy_seconds(spans: list[tuple[float, float, int]]) -> float:
    """Return the seconds at least one of ``spans`` covers (overlaps counted once)."""
    busy, end = 0.0, None
    for start, finish, _ in sorted(spans):
        if end is None or start > end:
            busy += max(finish - start, 0.0)
            end = finish
        elif finish > end:
            busy += finish - end
            end = finish
    return busy


def generation_average(spans: list[tuple[float, float, int]]) -> float | None:
    """Return *tokens/s while generating*, the report's and the monitor's one figure: output
    tokens over the time at least one shard generated (overlaps once, gaps not), or None."""
    busy = busy_seconds(spans)
    return sum(tokens for _, _, tokens in spans) / busy if busy > 0 else None


def generating_segments(produced: list[ShardFacts]) -> list[Span]:
    """Return the spans (absolute times) when at least one produced shard was generating."""
    windows = []
    for s in produced:
        spans = [_span(c) for c in s.completions if c.finished_at]
        if spans:
            windows.append((min(lo for lo, _ in spans), max(hi for _, hi in spans)))
    return _union(windows)


def make_bins(segments: list[Span], bin_s: float) -> list[tuple[float, float, int]]:
    """Return ``(lo, hi, segment)`` bins: each segment cut in ``bin_s`` steps, the last short."""
    bins = []
    for k, (lo, hi) in enumerate(segments):
        n = max(1, math.ceil((hi - lo) / bin_s - 1e-9))
        bins += [(lo + i * bin_s, min(lo + (i + 1) * bin_s, hi), k) for i in range(n)]
    return bins


def _overlaps(bins: list[tuple[float, float, int]], starts: list[float], lo: float,
              hi: float) -> Iterator[tuple[int, float]]:
    """Yield ``(bin index, seconds of [lo, hi] in it)``; an instant lands in its own bin."""
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    if hi - lo <= 1e-9:
        yield i, 0.0
        return
    while i < len(bins) and bins[i][0] < hi:
        part = min(hi, bins[i][1]) - max(lo, bins[i][0])
        if part > 0:
            yield i, part
        i += 1


def server_time(comps: list[Any], segments: list[Span], start: float, end: float
                ) -> dict[str, Any]:
    """Return busy, idle and between-tasks server-seconds (total, per server) and their shares.

    Shares are of server time: servers that answered x the run's wall time; the three add
    up to 1. ``between_tasks`` lists the gaps between generating segments (seconds from
    ``start``).
    """
    wall = max(end - start, 1e-9)
    generating = sum(hi - lo for lo, hi in segments)
    servers = sorted({c.server for c in comps})
    per_server = {}
    for srv in servers:
        busy = sum(hi - lo for lo, hi in _union([_span(c) for c in comps if c.server == srv]))
        per_server[srv] = {"busy_s": round(busy, 3), "idle_s": round(generating - busy, 3),
                           "between_tasks_s": round(wall - generating, 3)}
    n = len(servers)
    busy = sum(v["busy_s"] for v in per_server.values())
    idle = max(n * generating - busy, 0.0)
    between = n * (wall - generating)
    total = max(n * wall, 1e-9)
    gaps = [{"from_s": round(a[1] - start, 3), "to_s": round(b[0] - start, 3)}
            for a, b in zip(segments, segments[1:], strict=False)]
    return {
        "servers": n, "wall_s": round(wall, 3), "generating_s": round(generating, 3),
        "busy_server_s": round(busy, 3), "idle_server_s": round(idle, 3),
        "between_tasks_server_s": round(between, 3),
        "busy_fraction": round(busy / total, 4), "idle_fraction": round(idle / total, 4),
        "between_tasks_fraction": round(between / total, 4),
        "between_tasks": gaps, "per_server": per_server,
    }


def server_time_shares(tp: dict[str, Any]) -> dict[str, float]:
    """Return the busy/idle/between-tasks shares of server time the text and the plot show."""
    st = tp.get("server_time") or {}
    return {k: float(st.get(f"{k}_fraction", 0.0)) for k in ("busy", "idle", "between_tasks")}


def describe_server_time(tp: dict[str, Any]) -> str:
    """Return the sentence on server time; the plot's legend uses the same shares."""
    st = tp.get("server_time")
    if not st or not st["servers"]:
        return "No request was in flight on any server in this run."
    sh = server_time_shares(tp)
    gaps = st["between_tasks"]
    return (f"Server time ({st['servers']} servers x {st['wall_s']:,.1f} s): busy (a request "
            f"in flight) {sh['busy']:.1%}, idle (nothing in flight while a shard was "
            f"generating) {sh['idle']:.1%}, between tasks (no shard generating: "
            f"{len(gaps)} gap{'s' * (len(gaps) != 1)}, "
            f"{st['wall_s'] - st['generating_s']:,.1f} s) {sh['between_tasks']:.1%}.")


def _timeline(comps: list[Any], segments: list[Span], start: float, bin_s: float,
              servers: list[str]) -> list[dict[str, Any]]:
    bins = make_bins(segments, bin_s)
    starts = [b[0] for b in bins]
    tokens = {srv: [0.0] * len(bins) for srv in servers}
    busy = [0.0] * len(bins)
    for c in comps:
        lo, hi = _span(c)
        for i, part in _overlaps(bins, starts, lo, hi):
            # Without streaming, a request's tokens are spread evenly over its time in flight.
            tokens[c.server][i] += c.completion_tokens * (part / (hi - lo) if part else 1.0)
    for srv in servers:
        for lo, hi in _union([_span(c) for c in comps if c.server == srv]):
            for i, part in _overlaps(bins, starts, lo, hi):
                busy[i] += part
    out = []
    for i, (lo, hi, seg) in enumerate(bins):
        width = max(hi - lo, 1e-9)
        out.append({
            "t_s": round(lo - start, 3), "width_s": round(hi - lo, 3), "segment": seg,
            "output_tokens_per_s": round(sum(tokens[s][i] for s in servers) / width, 2),
            "per_server": {s: round(tokens[s][i] / width, 2) for s in servers},
            # Mean number of servers busy / idle over the bin (their sum: the servers).
            "busy_servers": round(busy[i] / width, 4),
            "idle_servers": round(len(servers) - busy[i] / width, 4),
        })
    return out


def throughput(produced: list[ShardFacts]) -> dict[str, Any]:
    """Return throughput over time and per server, server time, drains and retries."""
    comps = [c for s in produced for c in s.completions if c.finished_at]
    retries = {
        "extra_attempts": sum(c.attempts - 1 for s in produced for c in s.completions)
        + sum(a - 1 for s in produced for a in s.failed_attempts),
        "prompts_retried": sum(c.attempts > 1 for s in produced for c in s.completions)
        + sum(a > 1 for s in produced for a in s.failed_attempts),
    }
    if not comps:
        return {"wall_s": 0.0, "generating_s": 0.0, "output_tokens": 0,
                "output_tokens_per_s": 0.0, "bin_s": 0,
                "timeline": [], "per_server": {}, "drains": {"per_shard": {}}, "retries": retries,
                "server_time": None}
    start = min(c.finished_at - c.latency_s for c in comps)
    end = max(c.finished_at for c in comps)
    wall = max(end - start, 1e-9)
    out_tokens = sum(c.completion_tokens for c in comps)
    segments = generating_segments(produced)
    # Tokens/s has one definition, the monitor's too: generation_average over the shards'
    # generation spans (their manifests'), so both pages show one figure. Over the wall clock
    # instead, short shards with gaps between them read ~60% lower (issue 34).
    spans = [generation_span(s.generated) for s in produced]
    if spans and all(spans):
        generating_s = max(busy_seconds(spans), 1e-9)
        rate = sum(sp[2] for sp in spans) / generating_s  # type: ignore[index]
    else:  # manifests from before the spans: the completions' own windows
        generating_s = max(sum(hi - lo for lo, hi in segments), 1e-9)
        rate = out_tokens / generating_s
    # Bins sized on generating time: gaps between tasks are cut out, not binned.
    bin_s = _nice_bin(sum(hi - lo for lo, hi in segments))
    servers = sorted({c.server for c in comps})
    per_server = {}
    for srv in servers:
        mine = [c for c in comps if c.server == srv]
        last = max(c.finished_at for c in mine)
        tokens = sum(c.completion_tokens for c in mine)
        per_server[srv] = {
            "completed": len(mine), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / generating_s, 2),
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
        "generating_s": round(generating_s, 3),
        # Rounded as the monitor rounds it: the pages show the same digits.
        "output_tokens": out_tokens, "output_tokens_per_s": round(rate, 1),
        "bin_s": bin_s, "timeline": _timeline(comps, segments, start, bin_s, servers),
        "per_server": per_server, "drains": drains, "retries": retries,
        "server_time": server_time(comps, segments, start, end),
        "no_request_in_flight": idle_gaps(comps, start),
    }


def idle_gaps(comps: list[Any], start: float, min_s: float = 0.5) -> list[dict[str, float]]:
    """Return the spans (seconds from ``start``) when no request was in flight on any server.

    Such a span is either time between tasks (no shard generating) or every server idle
    while a shard generates; ``server_time`` tells the two apart.
    """
    spans = sorted(_span(c) for c in comps)
    gaps, reach = [], spans[0][1]
    for lo, hi in spans[1:]:
        if lo - reach >= min_s:
            gaps.append({"from_s": round(reach - start, 3), "to_s": round(lo - start, 3)})
        reach = max(reach, hi)
    return gaps
