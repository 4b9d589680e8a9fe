"""How long a real SGLang server takes to answer ``/health``, and how long a probe waits for it.

The numbers and the rule now live in ``include.sglang.contract`` beside every other SGLang
call; this module keeps their old import path for code that still uses it (the monitor page).
"""

from __future__ import annotations

from include.sglang.contract import (
    HEALTH_ANSWER_MIN_S,
    HEALTH_PROBE_TIMEOUT_FLOOR_S,
    health_probe_timeout_s,
)

__all__ = ["HEALTH_ANSWER_MIN_S", "HEALTH_PROBE_TIMEOUT_FLOOR_S", "health_probe_timeout_s"]
