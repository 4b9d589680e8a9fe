"""The evaluate DAG's check step reads the deployment and fails without a retry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.evaluation.helpers import prompt, write_split


def test_the_check_step_refuses_every_problem_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from include.pipeline.evaluate_check import problems, run

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 8}))
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 8}))
    monkeypatch.setenv("REGEN_OUTPUT_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("REGEN_ALLOWED_MODELS", json.dumps([str(target)]))
    monkeypatch.setenv("REGEN_ALLOWED_DRAFTERS", json.dumps({"good": str(good)}))
    (tmp_path / "out" / "run-a").mkdir(parents=True)
    monkeypatch.setenv("REGEN_GPU_HOSTS", json.dumps([{"host": "127.0.0.1", "gpus": [0, 1, 2]}]))
    params = {"dataset_run": "run-a", "baseline": "good", "candidates": ["other"]}
    found, _ = problems(params)
    assert len(found) == 2
    assert "'other' is not one the deployment allows" in found[0]
    assert "has no held-out split" in found[1]
    # fail_without_retry's exception type is being changed beside this work: match the words.
    with pytest.raises(BaseException, match="evaluate_drafter refused"):  # noqa: B017, PT011
        run(params)
    write_split(tmp_path / "out" / "run-a", [prompt(0, "math")])
    found, plan = problems({**params, "candidates": ["good"]})
    assert found == []
    assert plan == [{"config": "good", "dataset_run": "run-a"},
                    {"config": "target-only", "dataset_run": "run-a"}]
    assert problems({**params, "dataset_run": "../x"})[0][0].startswith("dataset_run:")
    # One server per configuration: three configurations on two servers are refused.
    monkeypatch.setenv("REGEN_ALLOWED_DRAFTERS", json.dumps({"good": str(good),
                                                              "also": str(good)}))
    monkeypatch.setenv("REGEN_GPU_HOSTS", json.dumps([{"host": "127.0.0.1", "gpus": [0, 1]}]))
    found, _ = problems({**params, "candidates": ["also"]})
    assert len(found) == 1 and "need as many servers" in found[0]
