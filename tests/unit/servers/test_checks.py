"""Server checks: the served name and context length, the budget line, the API key rules."""

from __future__ import annotations

from typing import Any

import pytest

from include.servers.expectations import (
    ModelExpectation,
    budget_line,
    key_problems,
    served_model_differences,
)
from include.settings import GpuHost
from tests.fixtures.settings import deployment_settings, run_settings


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
    assert served_model_differences(models(), expect()) == []


def test_run_settings_work_as_the_expectation() -> None:
    s = run_settings(
        {"model_path": "/m/Qwen", "served_model_name": "qwen", "context_length": 32768}
    )
    assert served_model_differences(models("qwen"), s) == []
    assert ModelExpectation.from_settings(s) == expect(max_tokens=s.max_tokens)
    unnamed = run_settings({"model_path": "/m/Qwen", "context_length": 32768})
    assert served_model_differences(models("/m/Qwen"), unnamed) == []


def test_max_tokens_at_the_context_length_is_accepted() -> None:
    # The per-request budget min(cap, C - P - margin) makes any cap safe (issue 10, item 5).
    s = run_settings({"served_model_name": "qwen", "context_length": 8192, "max_tokens": 8192})
    assert served_model_differences(models("qwen", 8192), s) == []
    assert served_model_differences(models("qwen", 8192), expect(context_length=8192,
                                                              max_tokens=9000)) == []


def test_budget_line_states_the_bound_and_the_skip_threshold() -> None:
    s = run_settings({"context_length": 8192, "max_tokens": 8192})
    assert budget_line(s) == (
        "completions are bounded by min(max_tokens=8192, 8192 - P - 16) tokens per prompt of "
        "P tokens; prompts leaving fewer than min_completion_tokens=256 are skipped (P > 7920)"
    )
    line = budget_line(expect(context_length=4096, max_tokens=100, context_margin=32,
                              min_completion_tokens=64))  # fmt: skip
    assert "min(max_tokens=100, 4096 - P - 32)" in line and "(P > 4000)" in line


def test_wrong_model_names_both_names_and_the_settings() -> None:
    (problem,) = served_model_differences(models("llama"), expect())
    assert "['llama']" in problem and "'qwen'" in problem
    assert "`served_model_name`" in problem and "`replace_mismatched_servers`" in problem


def test_wrong_context_length_says_how_to_fix_either_side() -> None:
    (problem,) = served_model_differences(models(length=4096), expect())
    assert "max_model_len 4096" in problem and "`context_length` is 32768" in problem
    assert "--context-length 32768" in problem


@pytest.mark.parametrize("answer", [{}, {"data": []}, [], None, {"data": "x"}])
def test_malformed_answers_are_problems(answer: Any) -> None:
    assert served_model_differences(answer, expect()) != []


def hosts(*names: str) -> list[GpuHost]:
    return [GpuHost(host=n, gpus=[0]) for n in names]


def test_non_loopback_hosts_need_a_key() -> None:
    d = deployment_settings(gpu_hosts=hosts("127.0.0.1", "gpu-a", "10.0.0.2"),
                            sglang_conn_id="sglang_prod")  # fmt: skip
    (problem,) = key_problems(d, None)
    assert "gpu-a, 10.0.0.2" in problem and "127.0.0.1" not in problem
    for fragment in ("REGEN_GPU_HOSTS", "REGEN_SGLANG_CONN_ID", "'sglang_prod'",
                     "AIRFLOW_CONN_SGLANG_PROD", "password"):  # fmt: skip
        assert fragment in problem
    assert key_problems(d, "sk-good") == []
    assert key_problems(deployment_settings(gpu_hosts=hosts("localhost", "::1")), None) == []


@pytest.mark.parametrize(
    ("key", "fragment"), [("-dash", "starts with '-'"), ("a b", "whitespace"), ("a\nb", "control")]
)
def test_keys_sglang_or_http_cannot_carry_are_refused(key: str, fragment: str) -> None:
    (problem,) = key_problems(deployment_settings(), key)
    assert fragment in problem and "REGEN_SGLANG_CONN_ID" in problem
    assert key not in problem  # the message never shows the key


def test_expectation_round_trips_through_json_data() -> None:
    e = expect(context_margin=32)
    assert ModelExpectation.from_dict(e.to_dict()) == e
