"""The retry policy, driven with plain results: no event loop, no server."""

from __future__ import annotations

import pytest

from include.engine import client as c
from include.engine.config import EngineConfig
from include.engine.retry import RetryDecision, Verdict, decide_retry

CONFIG = EngineConfig(model="m", context_length=8192, max_tokens=1024, context_margin=16,
                      min_completion_tokens=8, sampling={}, max_attempts=3,
                      backoff_base_s=0.5, backoff_max_s=1.5)
# Verbatim from SGLang (shared/docs/sglang-contract.md).
TOO_LONG = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."


def failed(kind: str, status: int | None = None, error: str = "e") -> c.ChatResult:
    return c.ChatResult(server="http://s", status=status, error_kind=kind, error=error)


def decide(result: c.ChatResult, charged: int = 0, length_retried: bool = False,
           counted: bool = False) -> RetryDecision:
    return decide_retry(result, charged, length_retried, CONFIG, counted=counted)


def test_a_completion_completes_and_charges_nothing() -> None:
    assert decide(c.ChatResult(ok=True), charged=2) == RetryDecision(Verdict.COMPLETE, 2)


def test_a_wrong_key_stops_the_shard_without_charging_the_prompt() -> None:
    unauthorized = failed(c.ErrorKind.UNAUTHORIZED, 401)
    assert decide(unauthorized, charged=1) == RetryDecision(Verdict.FATAL, 1)


def test_a_length_error_rebudgets_once_with_the_servers_count() -> None:
    result = failed(c.ErrorKind.LENGTH, 400, TOO_LONG)
    assert decide(result) == RetryDecision(Verdict.REBUDGET, 0, prompt_tokens=9000)
    assert decide(result, length_retried=True) == RetryDecision(Verdict.FAIL, 0)
    no_count = failed(c.ErrorKind.LENGTH, 400, "too long, no count")
    assert decide(no_count) == RetryDecision(Verdict.FAIL, 0)


@pytest.mark.parametrize("kind", [c.ErrorKind.HTTP_4XX, c.ErrorKind.BAD_RESPONSE])
def test_failures_no_retry_can_fix_are_final(kind: str) -> None:
    assert decide(failed(kind, 422), counted=True) == RetryDecision(Verdict.FAIL, 0)


@pytest.mark.parametrize("kind", sorted(c.RETRYABLE))
def test_a_failure_not_charged_to_the_prompt_never_uses_up_its_attempts(kind: str) -> None:
    # A brownout: however often it fails, the prompt waits for the servers, at once while it
    # has no charged failure, else after the backoff its charged failures earned.
    for _ in range(10):
        assert decide(failed(kind)) == RetryDecision(Verdict.RETRY, 0)
        assert decide(failed(kind), charged=2) == RetryDecision(Verdict.RETRY, 2, delay_s=1.0)


def test_charged_failures_back_off_exponentially_up_to_the_cap_then_fail() -> None:
    result = failed(c.ErrorKind.HTTP_5XX, 500)
    first = decide(result, charged=0, counted=True)
    assert first == RetryDecision(Verdict.RETRY, 1, delay_s=0.5)
    second = decide(result, charged=1, counted=True)
    assert second == RetryDecision(Verdict.RETRY, 2, delay_s=1.0)
    assert decide(result, charged=2, counted=True) == RetryDecision(Verdict.FAIL, 3)
    wide = EngineConfig(**{**CONFIG.__dict__, "max_attempts": 6})
    assert decide_retry(result, 4, False, wide, counted=True).delay_s == 1.5  # capped
