"""How long a real SGLang server takes to answer ``/health``, and how long a probe waits for it.

SGLang's ``/health`` (one handler with ``/health_generate``, ``entrypoints/http_server.py``
``health_generate``, v0.5.23) submits a one-token generation, then ``await asyncio.sleep(1)``
before it first looks whether the scheduler answered: a healthy server's 200 takes at least
1 s, more on a busy host. A probe that gives up sooner sees every healthy server as down.
Every ``/health`` probe in this project (the health gate's trigger, the engine's server pool,
the monitor page) takes its timeout from ``health_probe_timeout_s``.

A leaf module: it imports nothing from ``include``, so any stage may import it.
"""

from __future__ import annotations

#: The least time a healthy SGLang server takes to answer ``/health`` (its handler sleeps 1 s).
HEALTH_ANSWER_MIN_S = 1.0
#: The shortest timeout any ``/health`` probe may use: the 1 s sleep, plus a loaded host's
#: scheduling and the round trip, with room to spare.
HEALTH_PROBE_TIMEOUT_FLOOR_S = 5.0


def health_probe_timeout_s(wanted: float = 0.0) -> float:
    """Return the timeout of one ``/health`` probe: ``wanted``, never below the floor."""
    return max(HEALTH_PROBE_TIMEOUT_FLOOR_S, float(wanted))
