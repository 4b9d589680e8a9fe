"""What the engine needs from a run's settings, plus its own tuning knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs from the run settings (see ``from_settings``)."""

    model: str
    context_length: int
    max_tokens: int
    context_margin: int
    min_completion_tokens: int
    sampling: dict[str, Any]
    concurrency_mode: str = "adaptive"
    in_flight_per_server: int = 32
    min_in_flight_per_server: int = 8
    max_in_flight_per_server: int = 512
    request_timeout_s: float = 1800.0
    connect_timeout_s: float = 10.0
    max_attempts: int = 4
    #: Retryable failures in a row that rest a server (setting ``cool_down_after_failures``).
    cool_down_after_failures: int = 3
    #: First cool-down of a resting server, doubled per cool-down in a row, capped.
    cool_down_s: float = 5.0
    cool_down_max_s: float = 30.0
    health_interval_s: float = 5.0
    progress_interval_s: float = 30.0
    api_key: str | None = None
    #: The Airflow connection whose password is the servers' API key (named in a 401's error).
    sglang_conn_id: str | None = None
    all_down_timeout_s: float = 600.0
    metrics_interval_s: float = 1.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Whole conversations: send a next turn to the server that answered the previous one
    #: (its radix cache holds the history). Off only to measure what it is worth.
    conversation_affinity: bool = True
    #: Mixed sampling (setting ``sampling_variants``, ``variants.py``) and the seed drawing it.
    sampling_variants: dict[str, list[Any]] = field(default_factory=dict)
    seed: int = 0

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> EngineConfig:
        """Return the engine configuration of a ``RunSettings``."""
        values = dict(
            model=settings.model_name,
            context_length=settings.context_length,
            max_tokens=settings.max_tokens,
            context_margin=settings.context_margin,
            min_completion_tokens=settings.min_completion_tokens,
            sampling={
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "top_k": settings.top_k,
                "enable_thinking": settings.enable_thinking,
            },
            concurrency_mode=settings.concurrency_mode,
            in_flight_per_server=settings.in_flight_per_server,
            min_in_flight_per_server=settings.min_in_flight_per_server,
            max_in_flight_per_server=settings.max_in_flight_per_server,
            request_timeout_s=settings.request_timeout_s,
            max_attempts=settings.max_attempts,
            cool_down_after_failures=settings.cool_down_after_failures,
            cool_down_s=settings.cool_down_s,
            cool_down_max_s=settings.cool_down_max_s,
            health_interval_s=settings.health_interval_s,
            progress_interval_s=settings.progress_interval_s,
            api_key=settings.api_key,
            sglang_conn_id=settings.deployment.sglang_conn_id,
            sampling_variants=settings.sampling_variants.mapping(),
            seed=settings.seed,
        )
        values.update(overrides)
        return cls(**values)
