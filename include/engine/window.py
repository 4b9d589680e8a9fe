"""Adaptive concurrency: each server's in-flight window follows its own queue (``/metrics``)."""

from __future__ import annotations

import re

_METRIC_RE = re.compile(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+\-]+|NaN)\s*$", re.M)


def parse_metrics(text: str) -> dict[str, float]:
    """Return the unlabelled-sum of every ``sglang:*`` gauge/counter in Prometheus text."""
    out: dict[str, float] = {}
    for name, value in _METRIC_RE.findall(text):
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def next_window(
    window: int, in_flight: int, queue: float, running: float, low: int, high: int
) -> int:
    """Return the next in-flight window for a server from its queue and batch sizes.

    The aim is a short, never-empty queue: the batch stays full (a finished request is
    replaced from the queue at once) without requests waiting for minutes. While the queue is
    empty and this client uses its window, the server has room: grow by half (slow start).
    With a short queue below target, grow by a quarter; when the queue is well above target,
    shrink by half the excess, weighted by this client's share of what the server holds (the
    other clients sharing it, e.g. other shards in flight, shrink by theirs).
    """
    target = max(2.0, running / 16)
    if queue < 1 and in_flight >= 0.9 * window:
        window = window + max(2, window // 2)
    elif queue < target and in_flight >= 0.9 * window:
        window = window + max(2, window // 4)
    elif queue > 3 * target:
        # Several clients (shards in flight) may share this server and all see the same
        # queue: each takes back only its share of the excess, or together they overshoot.
        share = in_flight / max(running + queue, in_flight, 1.0)
        window = window - max(1, int((queue - target) * share / 2))
    return max(low, min(high, window))
