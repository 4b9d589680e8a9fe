"""Render SGLang's Prometheus metrics (the subset the project reads) as exposition text.

Labels as each release sets them for a single-GPU server: the scheduler's gauges carry
`model_name, engine_type, tp_rank, pp_rank` and, since v0.5.23, `moe_ep_rank`
(v0.5.23 `observability/metrics_collector.py` `SchedulerMetricsCollector` labels; v0.5.6
`managers/scheduler_metrics_mixin.py` `init_metrics`); the tokenizer manager's counters and
histograms carry `model_name` and, since v0.5.23, `engine_type`
(`metrics_collector.py` `tokenizer_metric_labels`; v0.5.6 `tokenizer_manager.py`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# SGLang's bucket bounds for these two histograms (seconds).
TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 800.0,
)  # fmt: skip


@dataclass
class Histogram:
    """Count observations into cumulative-at-render buckets."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1


@dataclass
class Metrics:
    """Hold the counters and histograms; gauges are passed in at render time."""

    model_name: str
    version: str = "v0.5.23"
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_total: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def observe(self, *, ttft: float, e2e: float) -> None:
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)

    def labels(self) -> tuple[str, str]:
        """Return the (scheduler, tokenizer) label strings of this release."""
        name = f'model_name="{_escape(self.model_name)}",engine_type="unified"'
        if self.version == "v0.5.6":
            return f'{name},tp_rank="0",pp_rank="0"', f'model_name="{_escape(self.model_name)}"'
        return f'{name},tp_rank="0",pp_rank="0",moe_ep_rank="0"', name

    def render(
        self, *, running: int, queued: int, gen_throughput: float, token_usage: float = 0.0
    ) -> str:
        """Return the Prometheus text exposition of every metric."""
        sched_label, label = self.labels()
        out: list[str] = []

        def sample(name: str, kind: str, help_text: str, value: float, lab: str = label) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            out.append(f"{name}{suffix}{{{lab}}} {float(value)}")

        sample("sglang:num_running_reqs", "gauge", "The number of running requests.", running,
               sched_label)
        sample("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
               queued, sched_label)
        sample("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
               gen_throughput, sched_label)
        sample("sglang:token_usage", "gauge", "The token usage.", token_usage, sched_label)
        sample(
            "sglang:prompt_tokens",
            "counter",
            "Number of prefill tokens processed.",
            self.prompt_tokens_total,
        )
        sample(
            "sglang:cached_tokens",
            "counter",
            "Number of cached prompt tokens.",
            self.cached_tokens_total,
        )
        sample(
            "sglang:generation_tokens",
            "counter",
            "Number of generation tokens processed.",
            self.generation_tokens_total,
        )
        sample(
            "sglang:num_requests",
            "counter",
            "The number of processed requests.",
            self.num_requests_total,
        )
        for name, help_text, hist in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                self.e2e,
            ),
        ):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} histogram")
            cumulative = 0
            for bound, count in zip(hist.bounds, hist.counts, strict=False):
                cumulative += count
                out.append(f'{name}_bucket{{{label},le="{bound}"}} {float(cumulative)}')
            out.append(f'{name}_bucket{{{label},le="+Inf"}} {float(hist.n)}')
            out.append(f"{name}_count{{{label}}} {float(hist.n)}")
            out.append(f"{name}_sum{{{label}}} {hist.total}")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
