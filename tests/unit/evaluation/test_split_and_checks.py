"""The held-out split is read whole or refused; the evaluation's four refusals (issue 36 item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from include.evaluation.checks import request_problems, server_problems
from include.evaluation.compat import drafter_problems, read_config
from include.evaluation.settings import EvaluationRequest
from include.evaluation.split import SplitError, load_split
from include.storage.store import LocalStore
from tests.unit.evaluation.helpers import prompt, write_split

TARGET = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
          "hidden_size": 4096, "num_hidden_layers": 36}


def _drafter(root: Path, name: str, **config: object) -> str:
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(
        {"vocab_size": 151936, "hidden_size": 4096, **config}))
    return str(path)


def test_the_split_is_read_with_its_manifest(tmp_path: Path) -> None:
    prompts = [prompt(i, "math") for i in range(3)] + [prompt(0, "code")]
    write_split(tmp_path, prompts, seed=11)
    split = load_split(LocalStore(tmp_path))
    assert split.count == 4 and split.seed == 11
    assert split.per_source == {"math": 3, "code": 1}
    assert [p["id"] for p in split.prompts] == [p["id"] for p in prompts]


def test_a_split_shorter_than_its_manifest_is_refused(tmp_path: Path) -> None:
    write_split(tmp_path, [prompt(0, "math")], manifest={
        "split": "eval", "seed": 1, "per_source": {"math": 2}, "count": 2})
    with pytest.raises(SplitError, match="refusing a partial split"):
        load_split(LocalStore(tmp_path))


def _request(**kw: object) -> EvaluationRequest:
    return EvaluationRequest(**{"dataset_run": "demo", "baseline": "base",
                                "candidates": ["cand"], **kw})


def test_a_drafter_the_deployment_does_not_list_is_refused(tmp_path: Path) -> None:
    write_split(tmp_path / "run", [prompt(0, "math")])
    allowed = {"base": _drafter(tmp_path, "b")}
    problems = request_problems(_request(), allowed, LocalStore(tmp_path / "run"), TARGET,
                                read_config)
    assert problems == [
        "drafter 'cand' is not one the deployment allows (REGEN_ALLOWED_DRAFTERS: ['base'])"]


@pytest.mark.parametrize(("config", "words"), [
    ({"vocab_size": 32000}, "vocab_size 32000, the target 151936"),
    ({"hidden_size": 2048}, "hidden states of size 2048"),
    ({"target_hidden_size": 5120}, "hidden states of size 5120"),
    ({"target_architectures": ["LlamaForCausalLM"]}, "was made for ['LlamaForCausalLM']"),
    ({"dflash_config": {"target_layer_ids": [1, 17, 40]}}, "the target has 36"),
])
def test_a_drafter_that_does_not_fit_the_target_is_refused(
        tmp_path: Path, config: dict, words: str) -> None:
    path = _drafter(tmp_path, "d", **config)
    problems = drafter_problems("d", read_config(path), TARGET)
    assert len(problems) == 1 and words in problems[0]


def test_a_drafter_that_fits_passes(tmp_path: Path) -> None:
    path = _drafter(tmp_path, "d", target_architectures=["Qwen3ForCausalLM"],
                    dflash_config={"target_layer_ids": [1, 17, 35]})
    assert drafter_problems("d", read_config(path), TARGET) == []
    assert "has no config.json" in drafter_problems("x", read_config(str(tmp_path)), TARGET)[0]


def test_a_dataset_run_without_a_held_out_split_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run" / "prompts").mkdir(parents=True)
    allowed = {"base": _drafter(tmp_path, "b"), "cand": _drafter(tmp_path, "c")}
    problems = request_problems(_request(), allowed, LocalStore(tmp_path / "run"), TARGET,
                                read_config)
    assert len(problems) == 1 and "has no held-out split" in problems[0]


def test_servers_reporting_no_speculative_support_are_refused() -> None:
    infos = {"gpu0:30000": {"speculative_algorithm": None},
             "gpu1:30001": {"speculative_algorithm": "EAGLE3"},
             "gpu2:30002": {"speculative_algorithm": "DFLASH"}}
    problems = server_problems(infos, "EAGLE3")
    assert len(problems) == 2
    assert "gpu0:30000 reports no speculative decoding" in problems[0]
    assert "gpu2:30002 runs speculative algorithm DFLASH" in problems[1]


def test_the_form_refuses_names_that_could_be_paths_or_flags() -> None:
    for bad in ("../etc", "-x", "a b", "a/b"):
        with pytest.raises(ValueError, match="drafter name"):
            _request(baseline=bad)
    for bad in ("../x", "/abs", "a b"):
        with pytest.raises(ValueError, match="dataset_run"):
            _request(dataset_run=bad)


def test_allowed_drafters_are_a_deployment_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from include.settings.deployment import DeploymentSettings

    monkeypatch.delenv("REGEN_ALLOWED_DRAFTERS", raising=False)
    assert DeploymentSettings().allowed_drafters == {}
    monkeypatch.setenv("REGEN_ALLOWED_DRAFTERS", '{"eagle-a": "/models/eagle-a"}')
    assert DeploymentSettings().allowed_drafters == {"eagle-a": "/models/eagle-a"}
