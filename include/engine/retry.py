"""The retry policy: what becomes of a prompt after one request for it, as one pure function.

``decide_retry`` takes the request's result, what the prompt has used so far (the failures
charged to it, whether its budget was corrected already) and the engine config, and returns
one verdict; the engine (``engine.dispatch``) carries it out. No event loop, clock or randomness:
the engine adds jitter to the delay and counts the retries.

=============  ==============================================================================
verdict        when
=============  ==============================================================================
``complete``   the server answered with a completion
``rebudget``   the server refused the prompt as too long and said how many tokens it counted:
               send it once more with a budget from the server's count
``fatal``      401: the API key is wrong; no request can succeed, stop the shard and leave the
               prompt unfinished for the re-run
``retry``      a failure another try can fix (connection, timeout, 5xx, queue full), while the
               failures charged to the prompt are below ``max_attempts``
``fail``       anything else: a final ``failed`` record
=============  ==============================================================================

A retryable failure is charged to the prompt only when the pool says its server was working
for other prompts at the time (``ServerPool.record_failure``): in a brownout the prompts wait
for the servers instead of using up their attempts. A prompt with no failure charged goes back
at once (to a server in rotation); one with charged failures backs off exponentially.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from include.engine import client as c
from include.engine.config import EngineConfig
from include.sglang.length import prompt_tokens_from_length_error


class Verdict(StrEnum):
    """What becomes of a prompt after one request (the table above). The engine keeps one
    handler per verdict (``engine.dispatch._ShardGeneration``'s table); a verdict without
    one fails there."""

    COMPLETE = "complete"
    REBUDGET = "rebudget"
    FATAL = "fatal"
    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True)
class RetryDecision:
    """One verdict, with the prompt's failures charged after this result."""

    verdict: Verdict
    charged: int
    #: ``retry``: seconds to wait before sending again (before jitter); None sends it again at
    #: once, since no failure so far was the prompt's.
    delay_s: float | None = None
    #: ``rebudget``: the prompt's tokens as the server counted them.
    prompt_tokens: int | None = None


def decide_retry(
    result: c.ChatResult,
    charged: int,
    length_retried: bool,
    config: EngineConfig,
    *,
    counted: bool = False,
) -> RetryDecision:
    """Return what to do with a prompt after ``result``.

    ``charged``: the prompt's failures charged so far; ``length_retried``: its budget was
    corrected from a server's count already; ``counted``: the pool charged this (retryable)
    failure to the prompt.
    """
    if result.ok:
        return RetryDecision(Verdict.COMPLETE, charged)
    if result.error_kind == c.ErrorKind.LENGTH:
        server_tokens = prompt_tokens_from_length_error(result.error)
        if length_retried or server_tokens is None:
            return RetryDecision(Verdict.FAIL, charged)
        return RetryDecision(Verdict.REBUDGET, charged, prompt_tokens=server_tokens)
    if result.error_kind == c.ErrorKind.UNAUTHORIZED:
        return RetryDecision(Verdict.FATAL, charged)
    if not result.retryable:
        return RetryDecision(Verdict.FAIL, charged)
    charged += counted
    if charged >= config.max_attempts:
        return RetryDecision(Verdict.FAIL, charged)
    if not charged:
        return RetryDecision(Verdict.RETRY, charged)
    delay = min(config.backoff_max_s, config.backoff_base_s * 2 ** (charged - 1))
    return RetryDecision(Verdict.RETRY, charged, delay_s=delay)
