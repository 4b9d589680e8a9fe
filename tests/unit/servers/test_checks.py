"""check_served_model: the served name, the context length and the token budget."""

from __future__ import annotations

from typing import Any

import pytest

from include.servers.checks import (
    ModelExpectation,
    check_served_model,
    token_budget_problems,
    token_budget_warnings,
)
from tests.fixtures.settings import run_settings


def models(name: str = "qwen", length: int | None = 32768) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 1, "owned_by": "sglang", "root": name,
             "parent": None, "max_model_len": length}
        ],
    }  # fmt: skip


def expect(**values: Any) -> ModelExpectation:
    base = {"model_name": "qwen", "context_length": 32768, "max_tokens": 8192}
    return ModelExpectation(**{**base, **values})


def test_matching_server_has_no_problems() -> None:
    assert check_served_model(models(), expect()) == []


def test_run_settings_work_as_the_expectation() -> None:
    s = run_settings(
        {"model_path": "/m/Qwen", "served_model_name": "qwen", "context_length": 32768}
    )
    assert check_served_model(models("qwen"), s) == []
    assert ModelExpectation.from_settings(s) == expect(max_tokens=s.max_tokens)
    unnamed = run_settings({"model_path": "/m/Qwen", "context_length": 32768})
    assert check_served_model(models("/m/Qwen"), unnamed) == []


def test_the_8192_over_8192_failure_names_the_settings_to_change() -> None:
    # The failure that started the project: every request was rejected with HTTP 400.
    s = run_settings(
        {"served_model_name": "qwen", "context_length": 8192, "max_tokens": 8192}
    )
    problems = check_served_model(models("qwen", 8192), s)
    assert len(problems) == 1
    text = problems[0]
    assert "`max_tokens` (8192)" in text and "`context_length` (8192)" in text
    assert "lower max_tokens below 8176" in text and "raise context_length" in text
    assert token_budget_problems(expect(context_length=8192, max_tokens=9000))


def test_wrong_model_names_both_names_and_the_settings() -> None:
    (problem,) = check_served_model(models("llama"), expect())
    assert "['llama']" in problem and "'qwen'" in problem
    assert "`served_model_name`" in problem and "`replace_mismatched_servers`" in problem


def test_wrong_context_length_says_how_to_fix_either_side() -> None:
    (problem,) = check_served_model(models(length=4096), expect())
    assert "max_model_len 4096" in problem and "`context_length` is 32768" in problem
    assert "--context-length 32768" in problem


@pytest.mark.parametrize("answer", [{}, {"data": []}, [], None, {"data": "x"}])
def test_malformed_answers_are_problems(answer: Any) -> None:
    assert check_served_model(answer, expect()) != []


def test_no_room_for_prompts_is_a_problem() -> None:
    e = expect(context_length=300, max_tokens=100, context_margin=16, min_completion_tokens=290)
    assert any("leaves no room" in p for p in token_budget_problems(e))


def test_tight_budget_warns_but_passes() -> None:
    e = expect(context_length=8192, max_tokens=7600)
    assert check_served_model(models(length=8192), e) == []
    (warning,) = token_budget_warnings(e)
    assert "prompts longer than 576 tokens" in warning
    assert token_budget_warnings(expect()) == []


def test_expectation_round_trips_through_json_data() -> None:
    e = expect(context_margin=32)
    assert ModelExpectation.from_dict(e.to_dict()) == e
